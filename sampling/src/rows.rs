//! A block's per-position work on several threads. After each verify pass a target turns
//! γ + 1 rows of logits into distributions and scores them against the draft's supports; at
//! a vocabulary of 128 256 that is 0.6–0.9 ms a row on one core (BENCHMARKS.md), so 6 rows
//! cost as much as a large model's pass on a GPU. The positions are independent: each thread
//! takes a contiguous run of them and the results keep their order, so the numbers are the
//! same whatever the thread count.

/// Below this many entries for each thread on average, starting a thread (tens of µs) costs
/// more than it saves: at a vocabulary of 4 096, a block of up to 31 positions stays on the
/// calling thread.
const MIN_ENTRIES_PER_THREAD: usize = 64 * 1024;

/// `job(scratch, i)` for every `i` in `0..positions`, in order, on at most `threads` threads
/// (0 or 1: the calling thread alone), each with its own `scratch` from `make_scratch`.
/// A thread the system cannot start leaves its positions to the calling thread.
pub(crate) fn map_positions<S, T: Send>(
    positions: usize,
    entries_per_position: usize,
    threads: usize,
    make_scratch: impl Fn() -> S + Sync,
    job: impl Fn(&mut S, usize) -> T + Sync,
) -> Vec<T> {
    let by_work = positions.saturating_mul(entries_per_position) / MIN_ENTRIES_PER_THREAD;
    let threads = threads.min(positions).min(by_work).max(1);
    let run = |range: std::ops::Range<usize>| {
        let mut scratch = make_scratch();
        range.map(|i| job(&mut scratch, i)).collect::<Vec<T>>()
    };
    if threads == 1 {
        return run(0..positions);
    }
    let per_thread = positions.div_ceil(threads);
    let ranges: Vec<_> = (0..positions).step_by(per_thread).map(|s| s..(s + per_thread).min(positions)).collect();
    std::thread::scope(|scope| {
        let run = &run;
        let others: Vec<_> = ranges[1..]
            .iter()
            .map(|range| {
                let mine = range.clone();
                std::thread::Builder::new()
                    .name("specd-sampling".into())
                    .spawn_scoped(scope, move || run(mine))
                    .map_err(|_| range.clone())
            })
            .collect();
        let mut out = run(ranges[0].clone());
        for other in others {
            match other {
                Ok(handle) => out.extend(handle.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))),
                Err(range) => out.extend(run(range)),
            }
        }
        out
    })
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::sync::Mutex;

    use super::*;

    #[test]
    fn results_keep_their_order_whatever_the_thread_count() {
        for positions in [0, 1, 2, 5, 6, 7] {
            for threads in [0, 1, 2, 3, 4, 8] {
                let out = map_positions(positions, MIN_ENTRIES_PER_THREAD, threads, || (), |_, i| i * 10);
                assert_eq!(out, (0..positions).map(|i| i * 10).collect::<Vec<_>>(), "{positions} on {threads}");
            }
        }
    }

    #[test]
    fn large_blocks_spread_and_small_ones_stay() {
        let threads_seen = |positions: usize, entries: usize| {
            let seen = Mutex::new(HashSet::new());
            map_positions(
                positions,
                entries,
                4,
                || (),
                |_, _| seen.lock().unwrap().insert(std::thread::current().id()),
            );
            seen.into_inner().unwrap().len()
        };
        // Six positions for four threads: runs of two, on three threads.
        assert_eq!(threads_seen(6, 128_256), 3);
        assert_eq!(threads_seen(8, 128_256), 4);
        assert_eq!(threads_seen(6, 4_096), 1);
        assert_eq!(threads_seen(1, 1 << 20), 1);
    }

    #[test]
    fn each_thread_has_its_own_scratch() {
        // A scratch shared between threads would count more than its run's positions.
        let out = map_positions(
            6,
            MIN_ENTRIES_PER_THREAD,
            3,
            || 0usize,
            |seen, _| {
                *seen += 1;
                *seen
            },
        );
        assert_eq!(out, vec![1, 2, 1, 2, 1, 2]);
    }
}
