//! [`HotPool`]: threads that share a pass's parallel steps with the thread that runs the
//! pass, and stay awake between steps.
//!
//! A pass is a few dozen parallel steps (each linear layer, attention) with short serial work
//! between them (norms, rotations). A pool whose threads go to sleep when they find no work
//! (rayon's, after some 30 yields) has to wake them with a system call at nearly every step,
//! and on a virtual machine a wake-up costs tens of microseconds, as much as a small layer.
//! So while a pass runs ([`HotPool::pass`]) the helpers spin between its steps, and the
//! caller takes a share of every step itself instead of handing the pass to the pool and
//! waiting. Between passes they look for a millisecond more, giving their core way to any
//! other thread that wants it, and then sleep: on a small host the cores are then needed by
//! the other threads of a node (the network, a draft model beside the target).
//!
//! This module is the crate's second use of `unsafe` (the first is [`crate::isa`]'s
//! dispatch): a step is a closure borrowed from the caller's stack, and the helpers call it
//! through a pointer whose lifetime the type system cannot see. The protocol that makes it
//! sound is in [`HotPool::run`].

use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError, TryLockError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::error::KernelError;

/// How long a helper keeps looking for the next step of a running pass before it sleeps:
/// far longer than the serial work between two steps (tens of microseconds), so only a pass
/// stalled by something else lets its helpers sleep.
const SPIN_IN_PASS: Duration = Duration::from_millis(2);

/// How long a helper keeps looking when no pass runs, yielding its core every
/// [`YIELD_EVERY_IDLE`] looks. Passes that follow each other at once (a prompt in chunks, a
/// draft's steps) find it awake. It is a millisecond, not tens of microseconds, for the
/// hand-offs around a pass: a round wakes a node's model thread, then the thread that waits
/// for its reply, then the other node's, and on a small virtual machine each of those wakes
/// costs tens of microseconds. A helper that keeps looking through the gaps between a
/// round's passes, and gives way to any thread woken on its core, made them shorter
/// (BENCHMARKS.md has the measure). A node with no round to run still sleeps within a
/// millisecond.
const SPIN_IDLE: Duration = Duration::from_millis(1);

/// Between passes a helper yields its core this often, so that a thread woken there (the
/// network's, a model thread's) runs at once instead of waiting for the spin to end.
const YIELD_EVERY_IDLE: u32 = 64;

/// A step's work: `tasks` calls of the closure, by index.
type Task = dyn Fn(usize) + Sync;

/// Threads that run the tasks of one step at a time with the thread that submits it.
#[derive(Debug)]
pub(crate) struct HotPool {
    shared: Arc<Shared>,
    helpers: Vec<JoinHandle<()>>,
    /// Held while a step runs: a second caller (another model's pass, or a step inside a
    /// step) runs its step alone on its own thread instead of waiting.
    busy: Mutex<()>,
}

#[derive(Debug)]
struct Shared {
    /// The current step's number, its task count and its next unclaimed task, in one word
    /// ([`Claim`]): claiming a task is one compare-and-swap that also checks the step, so a
    /// helper late for one step can never claim a task of the next.
    claim: AtomicU64,
    /// The current step's closure, written before its number is published.
    step: Mutex<Option<StepRef>>,
    /// Tasks of the current step not yet finished.
    unfinished: AtomicUsize,
    /// A task of the current step panicked.
    panicked: AtomicBool,
    /// Passes running ([`HotPool::pass`]).
    passes: AtomicUsize,
    sleepers: Mutex<usize>,
    wake: Condvar,
    stop: AtomicBool,
}

/// The closure of a step, its lifetime erased.
#[derive(Debug, Clone, Copy)]
struct StepRef(*const Task);

// SAFETY: the pointer is to a `Sync` closure, and it is dereferenced only while the step it
// belongs to is running (see `HotPool::run`).
#[allow(unsafe_code)]
unsafe impl Send for StepRef {}

/// The claim word: a step's number (24 bits, wrapping), its task count and its next
/// unclaimed task (20 bits each).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Claim {
    number: u32,
    tasks: usize,
    next: usize,
}

const TASK_BITS: u32 = 20;
const TASK_MASK: u64 = (1 << TASK_BITS) - 1;
const NUMBER_MASK: u32 = (1 << (64 - 2 * TASK_BITS)) - 1;
/// Steps with more tasks run on the calling thread alone.
const MAX_TASKS: usize = TASK_MASK as usize;

impl Claim {
    fn unpack(word: u64) -> Self {
        Self {
            number: (word >> (2 * TASK_BITS)) as u32,
            tasks: ((word >> TASK_BITS) & TASK_MASK) as usize,
            next: (word & TASK_MASK) as usize,
        }
    }

    fn pack(self) -> u64 {
        (u64::from(self.number) << (2 * TASK_BITS)) | ((self.tasks as u64) << TASK_BITS) | self.next as u64
    }
}

impl HotPool {
    /// A pool of `threads` threads in all: the caller's and `threads - 1` helpers.
    pub(crate) fn new(threads: usize) -> Result<Self, KernelError> {
        Self::numbered_from(threads, 0)
    }

    /// A pool whose last step was `number` (the tests start near the wrap).
    fn numbered_from(threads: usize, number: u32) -> Result<Self, KernelError> {
        let shared = Arc::new(Shared {
            claim: AtomicU64::new(Claim { number, tasks: 0, next: 0 }.pack()),
            step: Mutex::new(None),
            unfinished: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            passes: AtomicUsize::new(0),
            sleepers: Mutex::new(0),
            wake: Condvar::new(),
            stop: AtomicBool::new(false),
        });
        // Built up in place, so that if a helper cannot start, dropping the pool stops the
        // ones that did.
        let mut pool = Self { shared, helpers: Vec::new(), busy: Mutex::new(()) };
        for i in 1..threads.max(1) {
            let shared = Arc::clone(&pool.shared);
            let helper = std::thread::Builder::new()
                .name(format!("specd-host-{threads}.{i}"))
                .spawn(move || shared.help())
                .map_err(|e| KernelError::Threads { threads, reason: e.to_string() })?;
            pool.helpers.push(helper);
        }
        Ok(pool)
    }

    /// Runs `op`, a pass whose steps [`Self::run`] splits: the helpers are woken now, while
    /// its first serial work runs, and spin between its steps until it returns.
    pub(crate) fn pass<R>(&self, op: impl FnOnce() -> R) -> R {
        struct Running<'a>(&'a Shared);
        impl Drop for Running<'_> {
            fn drop(&mut self) {
                self.0.passes.fetch_sub(1, Ordering::AcqRel);
            }
        }
        let shared = &*self.shared;
        shared.passes.fetch_add(1, Ordering::SeqCst);
        let _running = Running(shared);
        if *shared.sleepers.lock().unwrap_or_else(PoisonError::into_inner) > 0 {
            shared.wake.notify_all();
        }
        op()
    }

    /// Calls `task(i)` for every `i < tasks`, on the calling thread and the helpers, and
    /// returns when every call has returned. A panic in a task is raised again here, after
    /// every other task of the step has finished.
    pub(crate) fn run<'a>(&self, tasks: usize, task: &'a (dyn Fn(usize) + Sync + 'a)) {
        let _busy = match self.busy.try_lock() {
            Ok(guard) => guard,
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(TryLockError::WouldBlock) => {
                (0..tasks).for_each(task);
                return;
            }
        };
        if tasks <= 1 || tasks > MAX_TASKS || self.helpers.is_empty() {
            (0..tasks).for_each(task);
            return;
        }
        let shared = &*self.shared;
        // SAFETY (the protocol): the erased pointer is dereferenced only by a thread that
        // has claimed a task of this step, and a task is claimed only with a compare-and-swap
        // that sees this step's number. `unfinished` counts the tasks not yet finished, each
        // claimed task being finished (or caught panicking) before it is counted down; this
        // function returns, or unwinds, only after it reached zero. A helper claims its next
        // task before it counts its last one down, so a claim it wins is always of the step
        // whose closure it holds, even once the step numbers wrap. So no call of `task`
        // outlives this function's borrow of it. The step's slot is overwritten only by the
        // next step, which starts after this one has returned.
        #[allow(unsafe_code)]
        let erased: *const Task =
            unsafe { std::mem::transmute::<&'a (dyn Fn(usize) + Sync + 'a), &'static Task>(task) };
        *shared.step.lock().unwrap_or_else(PoisonError::into_inner) = Some(StepRef(erased));
        shared.unfinished.store(tasks, Ordering::Release);
        shared.panicked.store(false, Ordering::Relaxed);
        let number = Claim::unpack(shared.claim.load(Ordering::Relaxed)).number.wrapping_add(1) & NUMBER_MASK;
        shared.claim.store(Claim { number, tasks, next: 0 }.pack(), Ordering::SeqCst);
        if *shared.sleepers.lock().unwrap_or_else(PoisonError::into_inner) > 0 {
            shared.wake.notify_all();
        }
        // The caller takes tasks until none is left, whatever the helpers do (one may be
        // asleep, or not yet started): a step never waits on a helper that has no task.
        let mut first_panic = None;
        while let Some(i) = shared.claim_task(number) {
            if let Err(panic) = catch_unwind(AssertUnwindSafe(|| task(i))) {
                match first_panic {
                    None => first_panic = Some(panic),
                    Some(_) => drop_quietly(panic),
                }
            }
            shared.unfinished.fetch_sub(1, Ordering::AcqRel);
        }
        // A helper preempted in its task (on a host with fewer cores than threads) is let
        // run rather than spun against.
        let mut spins = 0u32;
        while shared.unfinished.load(Ordering::Acquire) != 0 {
            spins = spins.saturating_add(1);
            if spins > 4096 {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
        if let Some(panic) = first_panic {
            resume_unwind(panic);
        }
        if shared.panicked.load(Ordering::Acquire) {
            panic!("a task of a host kernel step panicked on a helper thread");
        }
    }
}

impl Shared {
    /// The next task of step `number`, if that step still has one.
    fn claim_task(&self, number: u32) -> Option<usize> {
        let mut word = self.claim.load(Ordering::Acquire);
        loop {
            let claim = Claim::unpack(word);
            if claim.number != number || claim.next >= claim.tasks {
                return None;
            }
            let claimed = Claim { next: claim.next + 1, ..claim }.pack();
            match self.claim.compare_exchange_weak(word, claimed, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Some(claim.next),
                Err(seen) => word = seen,
            }
        }
    }

    /// A helper's life: wait for a step it has not seen, take its tasks, repeat.
    fn help(&self) {
        // Steps are numbered from 1, so a helper that starts after the first was published
        // still takes part in it.
        let mut seen = 0;
        while let Some(number) = self.next_step(seen) {
            seen = number;
            let Some(mut i) = self.claim_task(number) else { continue };
            // The step's slot is read only once a task of it is claimed: until then it may
            // already hold a later step. `run` writes it before it publishes the step.
            let step = *self.step.lock().unwrap_or_else(PoisonError::into_inner);
            let StepRef(task) = step.expect("a published step has its closure");
            // SAFETY: a task of this step is claimed and not yet counted down, so the step
            // has not returned (see `HotPool::run`) and the closure it points to is alive.
            #[allow(unsafe_code)]
            let task = unsafe { &*task };
            loop {
                if let Err(panic) = catch_unwind(AssertUnwindSafe(|| task(i))) {
                    self.panicked.store(true, Ordering::Release);
                    drop_quietly(panic);
                }
                // The next task is claimed before this one is counted down: while this one
                // is outstanding the step cannot end, so no later step (one whose number
                // wrapped round to this one's) can be the one claimed, and the closure
                // above is still this step's.
                let next = self.claim_task(number);
                self.unfinished.fetch_sub(1, Ordering::AcqRel);
                match next {
                    Some(next) => i = next,
                    None => break,
                }
            }
        }
    }

    /// Spins, then sleeps, until a step after `seen` is published; `None` when the pool
    /// stops.
    fn next_step(&self, seen: u32) -> Option<u32> {
        let mut started = Instant::now();
        let mut spins = 0u32;
        loop {
            if self.stop.load(Ordering::Acquire) {
                return None;
            }
            let number = Claim::unpack(self.claim.load(Ordering::Acquire)).number;
            if number != seen {
                return Some(number);
            }
            spins = spins.wrapping_add(1);
            let in_pass = self.passes.load(Ordering::Relaxed) > 0;
            let limit = if in_pass { SPIN_IN_PASS } else { SPIN_IDLE };
            if spins.is_multiple_of(64) && started.elapsed() >= limit {
                self.sleep(seen);
                started = Instant::now();
            }
            if !in_pass && spins.is_multiple_of(YIELD_EVERY_IDLE) {
                std::thread::yield_now();
            }
            std::hint::spin_loop();
        }
    }

    /// Sleeps until a step after `seen` is published, the pool stops, or (when no pass was
    /// running) a pass starts.
    fn sleep(&self, seen: u32) {
        let mut sleepers = self.sleepers.lock().unwrap_or_else(PoisonError::into_inner);
        *sleepers += 1;
        // Checked again under the lock that `run` and `pass` take before they notify, so a
        // step or pass that starts in between is not slept through.
        let in_pass = self.passes.load(Ordering::SeqCst) > 0;
        while Claim::unpack(self.claim.load(Ordering::SeqCst)).number == seen
            && !self.stop.load(Ordering::Acquire)
            && (in_pass || self.passes.load(Ordering::SeqCst) == 0)
        {
            sleepers = self.wake.wait(sleepers).unwrap_or_else(PoisonError::into_inner);
        }
        *sleepers -= 1;
    }
}

/// Drops a caught panic's payload, whose own `drop` might panic: that must not end a helper
/// with its task uncounted, nor unwind `run` before its step has finished.
fn drop_quietly(payload: Box<dyn std::any::Any + Send>) {
    let _ = catch_unwind(AssertUnwindSafe(move || drop(payload)));
}

impl Drop for HotPool {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        drop(self.shared.sleepers.lock().unwrap_or_else(PoisonError::into_inner));
        self.shared.wake.notify_all();
        for helper in self.helpers.drain(..) {
            let _ = helper.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each task of each step runs once, whichever thread takes it, over enough steps that
    /// helpers spin into some and sleep through gaps before others.
    #[test]
    fn every_task_of_every_step_runs_exactly_once() {
        for threads in 1..=3 {
            let pool = HotPool::new(threads).unwrap();
            for step in 0..400usize {
                let tasks = step % 17;
                let counts: Vec<AtomicUsize> = (0..tasks).map(|_| AtomicUsize::new(0)).collect();
                pool.run(tasks, &|i| {
                    counts[i].fetch_add(1, Ordering::Relaxed);
                });
                assert!(counts.iter().all(|c| c.load(Ordering::Relaxed) == 1), "{threads} threads, step {step}");
                if step % 100 == 99 {
                    // Idle long enough for the helpers to sleep, then a pass that stalls
                    // long enough for them to sleep inside it, and a step after.
                    std::thread::sleep(SPIN_IN_PASS * 2);
                    let late = AtomicUsize::new(0);
                    pool.pass(|| {
                        std::thread::sleep(SPIN_IN_PASS * 2);
                        pool.run(5, &|_| {
                            late.fetch_add(1, Ordering::Relaxed);
                        });
                    });
                    assert_eq!(late.load(Ordering::Relaxed), 5, "{threads} threads, after a stalled pass");
                }
            }
        }
    }

    /// Two callers at once (two models' passes), and a step started inside a task, each
    /// finish their own tasks: the second runs alone on its thread.
    #[test]
    fn concurrent_and_nested_steps_finish() {
        let pool = Arc::new(HotPool::new(3).unwrap());
        let callers: Vec<_> = (0..2)
            .map(|_| {
                let pool = Arc::clone(&pool);
                std::thread::spawn(move || {
                    let mut total = 0;
                    for _ in 0..200 {
                        let sum = AtomicUsize::new(0);
                        pool.run(8, &|i| {
                            let inner = AtomicUsize::new(0);
                            pool.run(3, &|j| {
                                inner.fetch_add(j + 1, Ordering::Relaxed);
                            });
                            sum.fetch_add(i + inner.load(Ordering::Relaxed), Ordering::Relaxed);
                        });
                        total += sum.load(Ordering::Relaxed);
                    }
                    total
                })
            })
            .collect();
        for caller in callers {
            assert_eq!(caller.join().unwrap(), 200 * (28 + 8 * 6));
        }
    }

    /// A task that panics, on the caller's thread or on a helper's, makes the step panic
    /// after the other tasks finished, and the pool runs the next step whole. The caller's
    /// first task waits (up to a minute) until a helper has taken one, so both threads take
    /// part whatever the host's load.
    #[test]
    fn a_panicking_task_fails_its_step_and_not_the_pool() {
        let pool = HotPool::new(2).unwrap();
        for on_helper in [false, true] {
            let (failed, helped, done) = (AtomicBool::new(false), AtomicBool::new(false), AtomicUsize::new(0));
            let result = catch_unwind(AssertUnwindSafe(|| {
                pool.run(12, &|i| {
                    let helper = std::thread::current().name().is_some_and(|n| n.starts_with("specd-host"));
                    if helper {
                        helped.store(true, Ordering::Release);
                    } else {
                        let started = Instant::now();
                        while !helped.load(Ordering::Acquire) && started.elapsed() < Duration::from_secs(60) {
                            std::thread::sleep(Duration::from_micros(100));
                        }
                    }
                    if helper == on_helper && !failed.swap(true, Ordering::Relaxed) {
                        panic!("task {i} fails");
                    }
                    done.fetch_add(1, Ordering::Relaxed);
                });
            }));
            assert!(helped.load(Ordering::Relaxed), "a helper took part");
            assert!(result.is_err(), "on a helper: {on_helper}");
            assert_eq!(done.load(Ordering::Relaxed), 11, "on a helper: {on_helper}: the others ran");
            let after = AtomicUsize::new(0);
            pool.run(12, &|_| {
                after.fetch_add(1, Ordering::Relaxed);
            });
            assert_eq!(after.load(Ordering::Relaxed), 12);
        }
        // A pass that panics is no longer counted as running.
        assert!(catch_unwind(AssertUnwindSafe(|| pool.pass(|| panic!("the pass fails")))).is_err());
        assert_eq!(pool.shared.passes.load(Ordering::Relaxed), 0);
    }

    /// Steps whose numbers wrap round past the claim word's 24 bits run each task once.
    #[test]
    fn steps_run_whole_across_the_wrap_of_their_numbers() {
        let pool = HotPool::numbered_from(3, NUMBER_MASK - 50).unwrap();
        for step in 0..100usize {
            let counts: Vec<AtomicUsize> = (0..7).map(|_| AtomicUsize::new(0)).collect();
            pool.pass(|| {
                pool.run(7, &|i| {
                    counts[i].fetch_add(1, Ordering::Relaxed);
                });
            });
            assert!(counts.iter().all(|c| c.load(Ordering::Relaxed) == 1), "step {step}");
        }
        assert!(Claim::unpack(pool.shared.claim.load(Ordering::Relaxed)).number < 60, "the numbers wrapped");
    }

    #[test]
    fn the_claim_word_keeps_its_fields() {
        for claim in [
            Claim { number: 0, tasks: 0, next: 0 },
            Claim { number: NUMBER_MASK, tasks: MAX_TASKS, next: MAX_TASKS },
            Claim { number: 12345, tasks: 17, next: 3 },
        ] {
            assert_eq!(Claim::unpack(claim.pack()), claim);
        }
    }
}
