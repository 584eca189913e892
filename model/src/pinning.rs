//! One CPU for each thread of a CPU model's OpenMP team of two.
//!
//! libtorch runs a pass on a team of OpenMP threads that meet at a barrier after every
//! operation. When Linux puts two of the team on one CPU and leaves another idle, the pass
//! runs at half speed until a balancing pass moves one, which can take the rest of the pass.
//! On the 2-core machine of BENCHMARKS.md this happened to 0.5–3% of the demo target's verify
//! passes: the model thread woke while the draft's thread still held the other CPU, was
//! queued behind its own spinning worker, and the pass took about 2.2–2.5 times as long.
//! Pinned, the scheduler can no longer stack the team.
//!
//! Only a team of exactly two, on exactly two CPUs the process may run on:
//! - a team smaller than the CPUs it may use is left alone, since pinning would crowd the
//!   first of them;
//! - a larger team is left alone because of how libgomp keeps its threads. A region that
//!   asks for fewer threads than the pool holds ends the surplus. The next full region then
//!   starts them again from the model thread, and a new thread inherits its creator's single
//!   CPU, so the whole team would stay stacked for good. A team of two runs a region on one
//!   thread (which leaves the pool alone) or on both, so its pool never changes.
//!
//! Not where the user chose a binding (`OMP_PROC_BIND`, `OMP_PLACES`, `GOMP_CPU_AFFINITY`).
//! Linux only. Threads the model thread starts later (`--sampling-threads` above 1 on a CPU
//! node) share its CPU.

/// What [`pin_model_team`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TeamPinning {
    /// The model thread is on the first CPU, the other threads it started (the team's worker)
    /// on the second.
    Pinned { cpus: Vec<usize> },
    /// Left to the scheduler, and why.
    Unpinned(String),
}

/// Variables by which a user binds OpenMP threads themselves.
const BINDING_VARS: [&str; 3] = ["OMP_PROC_BIND", "OMP_PLACES", "GOMP_CPU_AFFINITY"];

/// The one team size pinned ([the module](self) says why).
const TEAM: usize = 2;

/// Whether a team of `team` threads, on `allowed` CPUs, is pinned; `Err`: why not.
fn decide(team: usize, allowed: usize, user_binding: Option<&str>) -> Result<(), String> {
    if let Some(var) = user_binding {
        return Err(format!("{var} is set"));
    }
    if team != TEAM || allowed != TEAM {
        return Err(format!("{team} threads on {allowed} CPUs (only a team of 2 on 2 CPUs is pinned)"));
    }
    Ok(())
}

/// Pins the calling thread, a CPU model's, and its OpenMP team, one CPU each, when
/// [the module](self) says to. Call on the model thread once its thread count is set.
pub fn pin_model_team() -> TeamPinning {
    let user_binding = BINDING_VARS.into_iter().find(|var| std::env::var_os(var).is_some());
    linux::pin(user_binding)
}

#[cfg(target_os = "linux")]
mod linux {
    use nix::sched::{CpuSet, sched_getaffinity, sched_setaffinity};
    use nix::unistd::{Pid, gettid};

    use super::{TeamPinning, decide};

    pub(super) fn pin(user_binding: Option<&str>) -> TeamPinning {
        let allowed = match allowed_cpus() {
            Ok(cpus) => cpus,
            Err(e) => return TeamPinning::Unpinned(format!("the CPUs allowed are unknown ({e})")),
        };
        let team = usize::try_from(tch::get_num_threads()).unwrap_or(1);
        if let Err(why) = decide(team, allowed.len(), user_binding) {
            return TeamPinning::Unpinned(why);
        }
        // OpenMP starts the team's other thread at the first parallel region; a reduction
        // large enough to be split is one. A failure only means the team may not exist yet,
        // which the count below catches.
        let _ = tch::Tensor::f_ones([1 << 18], (tch::Kind::Float, tch::Device::Cpu))
            .and_then(|t| t.f_sum(tch::Kind::Float));
        let others = match team_threads() {
            Ok(others) => others,
            Err(e) => return TeamPinning::Unpinned(format!("the team's threads are unknown ({e})")),
        };
        if others.is_empty() {
            return TeamPinning::Unpinned("the team's other thread is not there".into());
        }
        // Besides OpenMP's worker, libtorch starts an idle pool of its own (for kernels
        // specd does not run) with one thread fewer than the count: it goes with the worker.
        let mut placed: Vec<_> = others.iter().map(|&tid| (tid, allowed[1])).collect();
        placed.push((gettid(), allowed[0]));
        for (i, &(tid, cpu)) in placed.iter().enumerate() {
            if let Err(e) = set_cpus(tid, &[cpu]) {
                // Leave every thread as it was, free to run anywhere it may.
                for &(pinned, _) in &placed[..i] {
                    let _ = set_cpus(pinned, &allowed);
                }
                return TeamPinning::Unpinned(format!("thread {tid} could not be pinned to CPU {cpu} ({e})"));
            }
        }
        TeamPinning::Pinned { cpus: allowed }
    }

    /// The CPUs this thread may run on.
    fn allowed_cpus() -> nix::Result<Vec<usize>> {
        let set = sched_getaffinity(Pid::from_raw(0))?;
        Ok((0..CpuSet::count()).filter(|&cpu| set.is_set(cpu).unwrap_or(false)).collect())
    }

    /// The threads this thread started: a new thread takes its creator's name, and libgomp
    /// starts the team's threads from the model thread, which is named for its role.
    fn team_threads() -> std::io::Result<Vec<Pid>> {
        let own_name = std::fs::read_to_string("/proc/thread-self/comm")?;
        let own = gettid();
        let mut tids = Vec::new();
        for entry in std::fs::read_dir("/proc/self/task")? {
            let entry = entry?;
            let Some(tid) = entry.file_name().to_str().and_then(|s| s.parse::<i32>().ok()).map(Pid::from_raw) else {
                continue;
            };
            if tid != own && std::fs::read_to_string(entry.path().join("comm")).is_ok_and(|name| name == own_name) {
                tids.push(tid);
            }
        }
        Ok(tids)
    }

    fn set_cpus(tid: Pid, cpus: &[usize]) -> nix::Result<()> {
        let mut set = CpuSet::new();
        for &cpu in cpus {
            set.set(cpu)?;
        }
        sched_setaffinity(tid, &set)
    }
}

#[cfg(not(target_os = "linux"))]
mod linux {
    use super::TeamPinning;

    pub(super) fn pin(_user_binding: Option<&str>) -> TeamPinning {
        TeamPinning::Unpinned("not Linux".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_team_of_two_on_two_cpus_is_pinned() {
        assert_eq!(decide(2, 2, None), Ok(()));
        for (team, cpus) in [(1, 1), (1, 2), (2, 4), (4, 4), (8, 8), (2, 64)] {
            let why = decide(team, cpus, None).unwrap_err();
            assert!(why.starts_with(&format!("{team} threads on {cpus} CPUs")), "{why}");
        }
        assert_eq!(decide(2, 2, Some("OMP_PLACES")), Err("OMP_PLACES is set".into()));
    }
}
