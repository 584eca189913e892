//! How a long build reports what it is doing; the CLI draws bars, tests stay quiet.

/// Receives the stages of a build and each optimiser step.
pub trait Progress {
    /// A stage begins; `steps` is 0 for stages without steps.
    fn stage(&mut self, name: &str, steps: usize);
    /// Step `step` (1-based) of the current stage finished with this loss (`None` for a
    /// stage that trains nothing), at this many tokens per second so far.
    fn step(&mut self, step: usize, loss: Option<f64>, tokens_per_s: f64);
    /// A line worth telling the user (a cache hit, a result).
    fn note(&mut self, text: &str);
}

/// Reports nothing.
#[derive(Debug, Default)]
pub struct Quiet;

impl Progress for Quiet {
    fn stage(&mut self, _name: &str, _steps: usize) {}
    fn step(&mut self, _step: usize, _loss: Option<f64>, _tokens_per_s: f64) {}
    fn note(&mut self, _text: &str) {}
}
