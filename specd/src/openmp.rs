//! How long libtorch's idle CPU workers stay awake: set before libtorch starts.
//!
//! libtorch runs its CPU kernels on libgomp's thread team. A worker left without work spins
//! `GOMP_SPINCOUNT` times, then sleeps, and the next parallel region must wake it. libgomp
//! reads the count once, as it loads, which is before `main`. A target's verify pass comes
//! after the draft's whole block (γ draft steps and two messages: about 6 ms at γ = 3 on the
//! demo pair), later than libgomp's default 300 000 spins last (about 4 ms on the 2-core
//! machine of BENCHMARKS.md): its workers had gone to sleep, and the pass paid for waking
//! them, 0.5–1 ms of a 14 ms pass, which a target-only decode, whose passes follow one
//! another within a millisecond, never pays. So on Linux (where libtorch's OpenMP is
//! libgomp) a process about to run a target model starts itself again with [`SPIN_COUNT`],
//! unless `GOMP_SPINCOUNT` or `OMP_WAIT_POLICY` is set: the user's choice is kept.

use std::ffi::OsString;

/// About 14 ms of spinning on the machine of BENCHMARKS.md, longer than a drafting gap up to
/// γ = 8 there. Workers spin after a parallel region only, so an idle node spins once, after
/// its last pass, and not for ever.
const SPIN_COUNT: u64 = 1_000_000;

const SPIN_VAR: &str = "GOMP_SPINCOUNT";
const POLICY_VAR: &str = "OMP_WAIT_POLICY";
/// Marks the process started again, so that its log can say where the count came from.
const SET_BY_SPECD_VAR: &str = "SPECD_SET_GOMP_SPINCOUNT";

/// The spin count to start again with, or `None` when the environment already decides how
/// idle workers wait.
fn spin_count_to_set(spin: Option<&OsString>, policy: Option<&OsString>) -> Option<u64> {
    (spin.is_none() && policy.is_none()).then_some(SPIN_COUNT)
}

/// Replaces this process (same pid, arguments and environment) by itself with
/// `GOMP_SPINCOUNT` set, when the environment does not say how idle workers wait. Returns
/// when nothing is needed, or when starting again failed: then with a warning on stderr, and
/// the process goes on with libgomp's default. Elsewhere than on Linux it does nothing.
pub fn ensure_spin_count() {
    let Some(count) = spin_count_to_set(std::env::var_os(SPIN_VAR).as_ref(), std::env::var_os(POLICY_VAR).as_ref())
    else {
        return;
    };
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::process::CommandExt as _;
        // The file this process runs, even if its path was since replaced or deleted.
        let mut command = std::process::Command::new("/proc/self/exe");
        let mut args = std::env::args_os();
        if let Some(arg0) = args.next() {
            command.arg0(arg0);
        }
        // `exec` returns only on failure.
        let err = command.args(args).env(SPIN_VAR, count.to_string()).env(SET_BY_SPECD_VAR, "1").exec();
        eprintln!(
            "specd: could not start again with {SPIN_VAR}={count} ({err}); idle OpenMP workers keep libgomp's default"
        );
    }
    #[cfg(not(target_os = "linux"))]
    let _ = count;
}

/// How idle OpenMP workers wait in this process, for the log and the bench's report.
pub fn describe() -> String {
    let var = |name| std::env::var_os(name).map(|v| v.to_string_lossy().into_owned());
    // The mark alone could be inherited by a process whose user then set another count.
    let set_by_specd = var(SET_BY_SPECD_VAR).is_some() && var(SPIN_VAR) == Some(SPIN_COUNT.to_string());
    match (var(SPIN_VAR), var(POLICY_VAR)) {
        (Some(count), _) if set_by_specd => format!("{SPIN_VAR}={count} (specd's default)"),
        (Some(count), Some(policy)) => format!("{SPIN_VAR}={count}, {POLICY_VAR}={policy} (set by the user)"),
        (Some(count), None) => format!("{SPIN_VAR}={count} (set by the user)"),
        (None, Some(policy)) => format!("{POLICY_VAR}={policy} (set by the user)"),
        (None, None) => "libgomp's default".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_count_is_set_only_when_the_environment_says_nothing() {
        let some = |s: &str| Some(OsString::from(s));
        assert_eq!(spin_count_to_set(None, None), Some(SPIN_COUNT));
        assert_eq!(spin_count_to_set(some("300000").as_ref(), None), None);
        assert_eq!(spin_count_to_set(None, some("passive").as_ref()), None);
        assert_eq!(spin_count_to_set(some("0").as_ref(), some("active").as_ref()), None);
    }
}
