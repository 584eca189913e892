//! How the binary reports failures: invalid input is one line on stderr and exit code 2,
//! anything else exit code 1 with its cause chain; a closed stdout ends quietly.

use std::fmt;
use std::process::ExitCode;

/// The user asked for something that cannot be done as asked.
#[derive(Debug)]
pub struct InvalidInput(pub String);

impl fmt::Display for InvalidInput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for InvalidInput {}

/// A gRPC call failed: printed with its code, exit code 2 for INVALID_ARGUMENT, else 1.
#[derive(Debug)]
pub struct RpcFailure(pub tonic::Status);

impl fmt::Display for RpcFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {}", self.0.code(), self.0.message())
    }
}

impl std::error::Error for RpcFailure {}

impl RpcFailure {
    fn is_invalid_argument(&self) -> bool {
        self.0.code() == tonic::Code::InvalidArgument
    }
}

pub fn invalid(message: impl Into<String>) -> anyhow::Error {
    InvalidInput(message.into()).into()
}

/// The reader of our output went away (`specd … | head`): not worth an error message.
fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.downcast_ref::<std::io::Error>().is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
}

pub fn exit_code(result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) if is_broken_pipe(&err) => ExitCode::SUCCESS,
        Err(err)
            if err.is::<InvalidInput>()
                || err.downcast_ref::<RpcFailure>().is_some_and(RpcFailure::is_invalid_argument) =>
        {
            eprintln!("error: {err}");
            ExitCode::from(2)
        }
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}
