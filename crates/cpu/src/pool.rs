//! A persistent thread pool for data-parallel kernels.
//!
//! `run(n_tasks, f)` gives each thread (the caller too) a contiguous share
//! of the task indices, which it runs in order; a thread that runs out takes
//! tasks from the end of another's share. Consecutive tasks are usually
//! consecutive weight rows, so each thread streams one run of memory, whose
//! prefetches (`kernels::x86::prefetch_ahead`) run on into its next task,
//! and only the last tasks move between threads to even out uneven cores.
//! Workers spin briefly after a job (consecutive matmuls in a forward pass
//! arrive microseconds apart) and then sleep on a condvar, so an idle pool
//! costs no CPU. With one thread (and always on
//! wasm32) there are no workers and `run` is a plain loop.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

/// How long a worker (or the waiting caller) spins before sleeping.
const SPIN: std::time::Duration = std::time::Duration::from_micros(100);

/// One `run` call. Workers that arrive late (descheduled on a busy machine)
/// may still hold it after `run` returned: they find no task left and never
/// touch `f`, so the caller waits only for tasks, not for every worker.
struct Job {
    /// Lifetime-erased; only called for a claimed task, and every claimed
    /// task finishes before `run` returns.
    f: *const (dyn Fn(usize) + Sync),
    /// Each thread's share of the tasks still unclaimed, `[front, back)`
    /// packed as `front << 32 | back`: its owner claims the front, others
    /// the back.
    shares: Vec<AtomicU64>,
    /// Tasks not finished yet.
    pending: AtomicUsize,
    panicked: AtomicBool,
}

// SAFETY: `f` is Sync and only dereferenced under the rule above.
unsafe impl Send for Job {}
unsafe impl Sync for Job {}

struct Shared {
    /// Bumped once per `run`; workers wait for it to change.
    generation: AtomicU64,
    job: Mutex<Option<Arc<Job>>>,
    /// Workers sleeping on `wake` (lets `run` skip the futex call).
    sleepers: AtomicUsize,
    caller_sleeping: AtomicBool,
    shutdown: AtomicBool,
    lock: Mutex<()>,
    wake: Condvar,
    finished: Condvar,
}

/// Persistent worker threads; see the module docs.
pub struct ThreadPool {
    n_threads: usize,
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    /// Serialises concurrent `run` calls from different threads; a nested
    /// `run` (from inside a task) finds it held and runs inline.
    run_lock: Mutex<()>,
}

impl ThreadPool {
    /// A pool of `n_threads` threads in total, counting the caller
    /// (`n_threads - 1` workers are spawned). 0 is treated as 1; always 1 on
    /// wasm32.
    pub fn new(n_threads: usize) -> ThreadPool {
        let n_threads = if cfg!(target_arch = "wasm32") {
            1
        } else {
            n_threads.max(1)
        };
        let shared = Arc::new(Shared {
            generation: AtomicU64::new(0),
            job: Mutex::new(None),
            sleepers: AtomicUsize::new(0),
            caller_sleeping: AtomicBool::new(false),
            shutdown: AtomicBool::new(false),
            lock: Mutex::new(()),
            wake: Condvar::new(),
            finished: Condvar::new(),
        });
        let workers = (1..n_threads)
            .map(|i| {
                let s = shared.clone();
                std::thread::Builder::new()
                    .name(format!("blockdraft-cpu-{i}"))
                    .spawn(move || worker(&s, i))
                    .expect("spawn pool worker")
            })
            .collect();
        ThreadPool {
            n_threads,
            shared,
            workers,
            run_lock: Mutex::new(()),
        }
    }

    pub fn n_threads(&self) -> usize {
        self.n_threads
    }

    /// Run `f(task)` for every task in `0..n_tasks` across the pool, blocking
    /// until all are done; the calling thread works too. Each task runs exactly
    /// once. A panic in a task is re-raised here after the others finish.
    pub fn run(&self, n_tasks: usize, f: &(dyn Fn(usize) + Sync)) {
        if n_tasks == 0 {
            return;
        }
        if self.workers.is_empty() || n_tasks == 1 {
            (0..n_tasks).for_each(f);
            return;
        }
        let _guard = match self.run_lock.try_lock() {
            Ok(g) => g,
            Err(std::sync::TryLockError::WouldBlock) => {
                // Nested call from inside a task, or another thread is using
                // the pool: do not wait on ourselves, just run inline.
                (0..n_tasks).for_each(f);
                return;
            }
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
        };
        let s = &*self.shared;
        // SAFETY (lifetime erasure): see `Job::f`; we wait for `pending == 0`.
        let f: *const (dyn Fn(usize) + Sync) =
            unsafe { std::mem::transmute::<&(dyn Fn(usize) + Sync), _>(f) };
        assert!(
            u32::try_from(n_tasks).is_ok(),
            "thread pool: {n_tasks} tasks in one run"
        );
        let (n, n_threads) = (n_tasks as u64, self.n_threads as u64);
        let job = Arc::new(Job {
            f,
            shares: (0..n_threads)
                .map(|t| AtomicU64::new(share(t * n / n_threads, (t + 1) * n / n_threads)))
                .collect(),
            pending: AtomicUsize::new(n_tasks),
            panicked: AtomicBool::new(false),
        });
        *s.job.lock().unwrap_or_else(|e| e.into_inner()) = Some(job.clone());
        s.generation.fetch_add(1, Ordering::SeqCst);
        if s.sleepers.load(Ordering::SeqCst) > 0 {
            let _l = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }

        work(s, &job, 0);

        // Wait for the tasks other threads claimed.
        let start = std::time::Instant::now();
        let mut spins = 0u32;
        while job.pending.load(Ordering::Acquire) > 0 {
            spins += 1;
            if spins & 63 == 0 && start.elapsed() > SPIN {
                let mut l = s.lock.lock().unwrap_or_else(|e| e.into_inner());
                s.caller_sleeping.store(true, Ordering::SeqCst);
                while job.pending.load(Ordering::SeqCst) > 0 {
                    l = s.finished.wait(l).unwrap_or_else(|e| e.into_inner());
                }
                s.caller_sleeping.store(false, Ordering::SeqCst);
                break;
            }
            std::hint::spin_loop();
        }
        *s.job.lock().unwrap_or_else(|e| e.into_inner()) = None;
        if job.panicked.load(Ordering::SeqCst) {
            panic!("a thread-pool task panicked");
        }
    }
}

/// `[front, back)` as a [`Job::shares`] entry.
fn share(front: u64, back: u64) -> u64 {
    front << 32 | back
}

/// Claims the first unclaimed task of a share (`from_back`: the last).
fn claim(share_of: &AtomicU64, from_back: bool) -> Option<usize> {
    let mut v = share_of.load(Ordering::Relaxed);
    loop {
        let (front, back) = (v >> 32, v & 0xFFFF_FFFF);
        if front >= back {
            return None;
        }
        let (task, next) = if from_back {
            (back - 1, share(front, back - 1))
        } else {
            (front, share(front + 1, back))
        };
        match share_of.compare_exchange_weak(v, next, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return Some(task as usize),
            Err(now) => v = now,
        }
    }
}

/// Claim and run tasks of `job` until none are left: thread `me`'s own
/// share first, then the others' from their ends.
fn work(s: &Shared, job: &Job, me: usize) {
    let n = job.shares.len();
    let next = || {
        claim(&job.shares[me], false)
            .or_else(|| (1..n).find_map(|d| claim(&job.shares[(me + d) % n], true)))
    };
    while let Some(i) = next() {
        // SAFETY: task i is claimed and unfinished, so `run` is still waiting
        // and `f` is alive.
        let f = unsafe { &*job.f };
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(i))).is_err() {
            job.panicked.store(true, Ordering::SeqCst);
        }
        if job.pending.fetch_sub(1, Ordering::SeqCst) == 1
            && s.caller_sleeping.load(Ordering::SeqCst)
        {
            let _l = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.finished.notify_all();
        }
    }
}

fn worker(s: &Shared, me: usize) {
    let mut seen = 0u64;
    loop {
        // Wait for a new generation: spin, then sleep.
        let start = std::time::Instant::now();
        let mut spins = 0u32;
        loop {
            if s.generation.load(Ordering::Acquire) != seen {
                break;
            }
            spins += 1;
            if spins & 63 == 0 && start.elapsed() > SPIN {
                let mut l = s.lock.lock().unwrap_or_else(|e| e.into_inner());
                s.sleepers.fetch_add(1, Ordering::SeqCst);
                while s.generation.load(Ordering::SeqCst) == seen {
                    l = s.wake.wait(l).unwrap_or_else(|e| e.into_inner());
                }
                s.sleepers.fetch_sub(1, Ordering::SeqCst);
                break;
            }
            std::hint::spin_loop();
        }
        seen = s.generation.load(Ordering::Acquire);
        if s.shutdown.load(Ordering::Acquire) {
            return;
        }
        let job = s.job.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if let Some(job) = job {
            work(s, &job, me);
        }
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        let s = &*self.shared;
        s.shutdown.store(true, Ordering::SeqCst);
        s.generation.fetch_add(1, Ordering::SeqCst);
        {
            let _l = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    #[test]
    fn every_task_runs_exactly_once() {
        for threads in [1, 2, 4] {
            let pool = ThreadPool::new(threads);
            assert_eq!(pool.n_threads(), threads);
            for n_tasks in [0, 1, 2, 3, 7, 64, 1000] {
                let counts: Vec<AtomicU32> = (0..n_tasks).map(|_| AtomicU32::new(0)).collect();
                pool.run(n_tasks, &|i| {
                    counts[i].fetch_add(1, Ordering::Relaxed);
                });
                assert!(counts.iter().all(|c| c.load(Ordering::Relaxed) == 1));
            }
        }
    }

    /// Each thread runs its own share front to back and takes others' tasks
    /// from their ends: the tasks it ran in its share rise, those it took
    /// from another's fall. Share 1's tasks are slow, so the others take
    /// some of them.
    #[test]
    fn threads_run_their_shares_in_order_and_take_from_the_ends() {
        let (threads, n_tasks) = (3, 60);
        let pool = ThreadPool::new(threads);
        let share_of = |task: usize| {
            (0..threads)
                .find(|&t| task < (t + 1) * n_tasks / threads)
                .unwrap()
        };
        let ran = Mutex::new(Vec::new());
        pool.run(n_tasks, &|i| {
            if share_of(i) == 1 {
                std::thread::sleep(std::time::Duration::from_micros(300));
            }
            let me = std::thread::current()
                .name()
                .and_then(|n| n.strip_prefix("blockdraft-cpu-"))
                .map_or(0, |i| i.parse().unwrap());
            ran.lock().unwrap().push((me, i));
        });
        let ran = ran.into_inner().unwrap();
        let mut all: Vec<usize> = ran.iter().map(|&(_, i)| i).collect();
        all.sort_unstable();
        assert_eq!(all, (0..n_tasks).collect::<Vec<_>>());
        let mut taken = 0;
        for me in 0..threads {
            for share in 0..threads {
                let tasks: Vec<usize> = ran
                    .iter()
                    .filter(|&&(t, i)| t == me && share_of(i) == share)
                    .map(|&(_, i)| i)
                    .collect();
                if share == me {
                    assert!(
                        tasks.windows(2).all(|w| w[0] < w[1]),
                        "thread {me}'s own: {tasks:?}"
                    );
                } else {
                    assert!(
                        tasks.windows(2).all(|w| w[0] > w[1]),
                        "thread {me} from {share}: {tasks:?}"
                    );
                    taken += tasks.len();
                }
            }
        }
        assert!(taken > 0, "no thread took another's tasks: {ran:?}");
    }

    #[test]
    fn many_back_to_back_runs_and_sleeping_workers() {
        let pool = ThreadPool::new(3);
        let total = AtomicUsize::new(0);
        for round in 0..2000 {
            pool.run(5, &|i| {
                total.fetch_add(i + 1, Ordering::Relaxed);
            });
            if round % 500 == 0 {
                // Let workers fall asleep, then wake them again.
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
        }
        assert_eq!(total.load(Ordering::Relaxed), 2000 * 15);
    }

    /// More threads than cores: late workers must not run finished jobs'
    /// tasks again or miss any.
    #[test]
    fn oversubscribed_pool_runs_each_task_once() {
        let pool = ThreadPool::new(8);
        for round in 0..300 {
            let n_tasks = 1 + round % 17;
            let counts: Vec<AtomicU32> = (0..n_tasks).map(|_| AtomicU32::new(0)).collect();
            pool.run(n_tasks, &|i| {
                if i % 5 == 0 {
                    std::thread::yield_now();
                }
                counts[i].fetch_add(1, Ordering::Relaxed);
            });
            assert!(
                counts.iter().all(|c| c.load(Ordering::Relaxed) == 1),
                "round {round}"
            );
        }
    }

    #[test]
    fn nested_run_does_not_deadlock() {
        let pool = ThreadPool::new(2);
        let total = AtomicUsize::new(0);
        pool.run(4, &|_| {
            pool.run(3, &|_| {
                total.fetch_add(1, Ordering::Relaxed);
            });
        });
        assert_eq!(total.load(Ordering::Relaxed), 12);
    }

    #[test]
    fn task_panic_propagates_and_pool_survives() {
        let pool = ThreadPool::new(2);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            pool.run(8, &|i| {
                if i == 5 {
                    panic!("boom");
                }
            })
        }));
        assert!(r.is_err());
        let total = AtomicUsize::new(0);
        pool.run(8, &|_| {
            total.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(total.load(Ordering::Relaxed), 8);
    }

    #[test]
    fn pool_is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<ThreadPool>();
    }
}
