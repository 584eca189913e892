//! One CPU for each thread of a CPU model's OpenMP team.
//!
//! libtorch runs a pass on a team of OpenMP threads that meet at a barrier after every
//! operation. When Linux puts two of the team on one CPU and leaves another idle, the pass
//! runs at half speed until a balancing pass moves one, which can take the rest of the pass.
//! On the 2-core machine of BENCHMARKS.md this happened to 2–3% of the demo target's verify
//! passes: the model thread woke while the draft's thread still held the other CPU, was
//! queued behind its own spinning worker, and the pass took 2–2.5 times as long. A team with
//! one CPU each cannot be stacked.
//!
//! Only where the team uses every CPU the process may run on: in a container limited by a
//! quota on a larger host, pinning would crowd the first CPUs. Not where the user chose a
//! binding (`OMP_PROC_BIND`, `OMP_PLACES`, `GOMP_CPU_AFFINITY`). Linux only.

/// What [`pin_model_team`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TeamPinning {
    /// The model thread is on the first CPU, the team's other threads on the others.
    Pinned { cpus: Vec<usize>, threads: usize },
    /// Left to the scheduler, and why.
    Unpinned(String),
}

/// Variables by which a user binds OpenMP threads themselves.
const BINDING_VARS: [&str; 3] = ["OMP_PROC_BIND", "OMP_PLACES", "GOMP_CPU_AFFINITY"];

/// Whether a team of `team` threads, on `allowed` CPUs, is pinned; `Err`: why not.
fn decide(team: usize, allowed: usize, user_binding: Option<&str>) -> Result<(), String> {
    if let Some(var) = user_binding {
        return Err(format!("{var} is set"));
    }
    if team < 2 {
        return Err("one thread".into());
    }
    if team != allowed {
        return Err(format!("{team} threads on {allowed} CPUs"));
    }
    Ok(())
}

/// Pins the calling thread, a CPU model's, and its OpenMP team, one CPU each, when
/// [the module](self) says to. Call on the model thread once its thread count is set.
pub fn pin_model_team() -> TeamPinning {
    let user_binding = BINDING_VARS.into_iter().find(|var| std::env::var_os(var).is_some());
    imp::pin(user_binding)
}

#[cfg(target_os = "linux")]
mod imp {
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
        // OpenMP starts the team's other threads at the first parallel region; a reduction
        // large enough to be split is one.
        let _ = tch::Tensor::ones([1 << 18], (tch::Kind::Float, tch::Device::Cpu)).sum(tch::Kind::Float);
        let others = match team_threads() {
            Ok(others) => others,
            Err(e) => return TeamPinning::Unpinned(format!("the team's threads are unknown ({e})")),
        };
        let mut placed = vec![(gettid(), allowed[0])];
        placed.extend(others.iter().enumerate().map(|(i, &tid)| (tid, allowed[1 + i % (allowed.len() - 1)])));
        for &(tid, cpu) in &placed {
            if let Err(e) = pin_thread(tid, cpu) {
                // Nothing to undo: a thread left unpinned is where it would have been anyway.
                return TeamPinning::Unpinned(format!("thread {tid} could not be pinned to CPU {cpu} ({e})"));
            }
        }
        TeamPinning::Pinned { cpus: allowed, threads: placed.len() }
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
        tids.sort_unstable();
        Ok(tids)
    }

    fn pin_thread(tid: Pid, cpu: usize) -> nix::Result<()> {
        let mut set = CpuSet::new();
        set.set(cpu)?;
        sched_setaffinity(tid, &set)
    }
}

#[cfg(not(target_os = "linux"))]
mod imp {
    use super::TeamPinning;

    pub(super) fn pin(_user_binding: Option<&str>) -> TeamPinning {
        TeamPinning::Unpinned("not Linux".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_team_is_pinned_only_when_it_fills_the_cpus_it_may_use() {
        assert_eq!(decide(2, 2, None), Ok(()));
        assert_eq!(decide(8, 8, None), Ok(()));
        assert_eq!(decide(1, 1, None), Err("one thread".into()));
        assert_eq!(decide(2, 64, None), Err("2 threads on 64 CPUs".into()));
        assert_eq!(decide(2, 2, Some("OMP_PLACES")), Err("OMP_PLACES is set".into()));
    }
}
