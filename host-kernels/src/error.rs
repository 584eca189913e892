//! What can go wrong setting the kernels up.

#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    /// The pool's threads could not be started.
    #[error("cannot start {threads} host-engine threads: {reason}")]
    Threads { threads: usize, reason: String },
}
