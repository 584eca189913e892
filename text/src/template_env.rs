//! The Jinja environment transformers gives chat templates, rebuilt on minijinja.
//!
//! transformers renders with `ImmutableSandboxedEnvironment(trim_blocks=True,
//! lstrip_blocks=True, extensions=[loopcontrols])`, its own `tojson` filter (Python's
//! `json.dumps`, no HTML escaping), and the globals `raise_exception(msg)` and
//! `strftime_now(fmt)`; templates also call Python string and dict methods (`.strip()`,
//! `.startswith()`, `.items()`), which minijinja-contrib's `pycompat` callback provides.

use minijinja::{Environment, Error, ErrorKind};

use crate::python_json;
use crate::strftime;

/// The source of an error raised by a template's `raise_exception`, so that a render error can
/// be told apart from the template's own failures.
#[derive(Debug)]
pub struct RaisedByTemplate(pub String);

impl std::fmt::Display for RaisedByTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for RaisedByTemplate {}

/// A fresh environment configured as transformers configures Jinja.
pub fn environment() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_filter("tojson", python_json::tojson);
    env.add_function("raise_exception", raise_exception);
    env.add_function("strftime_now", strftime_now);
    env
}

fn raise_exception(message: String) -> Result<String, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message.clone()).with_source(RaisedByTemplate(message)))
}

fn strftime_now(pattern: &str) -> Result<String, Error> {
    strftime::now(pattern).map_err(|e| Error::new(ErrorKind::InvalidOperation, e))
}

/// The message of a `raise_exception` somewhere in the error's chain.
pub fn raised_message(err: &Error) -> Option<String> {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = source {
        if let Some(raised) = e.downcast_ref::<RaisedByTemplate>() {
            return Some(raised.0.clone());
        }
        source = e.source();
    }
    None
}
