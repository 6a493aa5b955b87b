//! Busy polling on the session threads: after a session answers, its thread keeps
//! polling its sockets for a short window (`--busy-poll`) before it sleeps.
//!
//! A thread that sleeps in `epoll_wait` is woken by the kernel when its client writes.
//! When the core under it has halted (on a virtual machine, an idle vCPU exits to the
//! hypervisor), that wake is an inter-processor interrupt and costs tens of
//! microseconds: on the 2-core machine of the benchmarks, a loopback ping-pong between
//! two threads on different cores does 17 k round trips/s, and 64 k on one core. A
//! client that sends its next statement within the window finds the thread awake, and
//! the wake is not paid. A quiet session costs nothing: polling stops once the window
//! passes with no new message.
//!
//! Polling adapts to load: while more than one session of the node waits for its fsync,
//! no thread polls, neither for a commit nor after an answer. The committer and the
//! clients then need the cores the polling threads would spin on, and an fsync takes
//! long enough that a wake-up costs little. With pgbench, durable (alternated runs):
//! polling for every commit ran 2 clients at 1.6–2.0 k/s, 4 at 4.3–4.8 k/s and 16 at
//! 15.2–15.8 k/s; polling for a lone commit only, 2.8–3.1, 5.9–6.8 and 17.9–19.6 k/s;
//! no answer's window either while commits wait, 16 clients 15.4–17.6 → 18.0–20.7 k/s
//! and 64 clients 29.5–29.9 → 32.1–32.4 k/s. A single durable client keeps the polling
//! for its commit (when the committer, not its own thread, makes it).
//! In Kafka mode no thread polls for a commit (`EventLog::poll_while_durable`): the
//! wait is the broker's work and librdkafka's threads', on the same cores.
//!
//! No thread polls after the answer of a durable statement. Its round trip is
//! its fsync's, and polling for the client's next statement made it slower, not faster:
//! one durable pgbench client, `--busy-poll 100` against 0 (alternated), 5.2–5.3 k
//! against 5.3–6.1 k/s (five pairs, median +11 %), with 0.53 CPUs against 0.39.
//!
//! Polling also stops once more sessions are active than half the cores (`Active`: a
//! session is active from a message until it has waited `ACTIVE_FOR` for the next). A
//! poller spins while its clients think, and clients on the same cores then lose the
//! time they need to answer: pgbench, commit off, `--busy-poll 100` against 0 on the
//! 2-core machine (alternated), 2 clients 27–40 k against 45–72 k/s and 4 clients 32 k
//! against 38–47 k/s, while one client ran at 14–15 k against 7–9 k/s and prepared
//! lookups from 2 clients did not differ (80–93 k against 82–89 k/s).
//!
//! The poller is a task on each session thread's own runtime. While the window is
//! open it yields to the runtime, which polls its sockets (`epoll_wait` with no
//! timeout) and runs whatever became ready; then it sleeps until a session answers
//! again. It does not yield the core itself: a thread woken for it preempts the poller
//! (measured: `sched_yield` in the loop only added context switches, and pgbench
//! lookups with two clients on two cores were no faster).

use std::cell::Cell;
use std::future::{poll_fn, Future};
use std::pin::pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::LazyLock;
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

/// The default window, in microseconds: longer than a client's turn between two
/// statements on loopback (psycopg's is about 30 µs), short enough that an idle node
/// does not burn a core.
pub const DEFAULT_US: u64 = 100;

/// The longest a thread polls for a session that awaits its commit (`Committing`).
const COMMIT_POLL_MAX: Duration = Duration::from_millis(1);

/// Sessions of the whole node waiting for their commit.
static COMMITTING_ON_NODE: AtomicUsize = AtomicUsize::new(0);

/// How long a session stays active after its last message: far longer than a busy
/// client's turn between two statements, so one sending in a loop never leaves.
const ACTIVE_FOR: Duration = Duration::from_millis(5);

/// Sessions of the whole node that are active (`Active`).
static ACTIVE_ON_NODE: AtomicUsize = AtomicUsize::new(0);

/// The most active sessions with which threads still poll after an answer: half the
/// cores (at least one), so pollers and clients on the same machine fit on its cores.
static ACTIVE_POLL_MAX: LazyLock<usize> =
    LazyLock::new(|| (std::thread::available_parallelism().map_or(1, |n| n.get()) / 2).max(1));

thread_local! {
    /// When a session of this thread last finished a message.
    static ANSWERED: Cell<Option<Instant>> = const { Cell::new(None) };
    /// When a durable statement of this thread last finished waiting for its commit.
    static COMMITTED: Cell<Option<Instant>> = const { Cell::new(None) };
    /// Sessions of this thread waiting for their commit, and since when one has been.
    static COMMITTING: Cell<(u32, Option<Instant>)> = const { Cell::new((0, None)) };
    /// The thread's poller, asleep until a session answers.
    static POLLER: Cell<Option<Waker>> = const { Cell::new(None) };
    /// Rounds the thread's poller made (for the tests).
    static ROUNDS: Cell<u64> = const { Cell::new(0) };
}

/// A session has answered a message and is about to wait for the next (`Active::next`):
/// opens the window of its thread's poller.
fn answered() {
    ANSWERED.set(Some(Instant::now()));
    // With many sessions active no window opens: the poller is left asleep, not woken
    // to find that out after every message.
    if few_active() {
        wake_poller();
    }
}

fn wake_poller() {
    if let Some(poller) = POLLER.take() {
        poller.wake();
    }
}

/// Held by a session while it waits for its statement's fsync: the fsync comes from
/// another thread within a fraction of a millisecond, so while it is the node's only
/// session waiting for one, its thread keeps polling (up to `COMMIT_POLL_MAX`) and the
/// answer goes out without a wake-up.
pub struct Committing(());

impl Committing {
    pub fn start() -> Committing {
        COMMITTING_ON_NODE.fetch_add(1, Ordering::Relaxed);
        let (n, since) = COMMITTING.get();
        COMMITTING.set((n + 1, since.or_else(|| Some(Instant::now()))));
        wake_poller();
        Committing(())
    }
}

impl Drop for Committing {
    fn drop(&mut self) {
        COMMITTING_ON_NODE.fetch_sub(1, Ordering::Relaxed);
        COMMITTED.set(Some(Instant::now()));
        let (n, since) = COMMITTING.get();
        COMMITTING.set(match n {
            0 | 1 => (0, None),
            n => (n - 1, since),
        });
    }
}

/// A session's part in `ACTIVE_ON_NODE`: active from a message until it has waited
/// `ACTIVE_FOR` for the next one. Dropped with its session.
#[derive(Default)]
pub struct Active(bool);

impl Active {
    /// Called once the session has answered its last message: opens its thread's polling
    /// window (`answered`) and waits for the next message (`next`). A message already
    /// read (another of the same packet) costs no timer.
    pub async fn next<F: Future>(&mut self, next: F) -> F::Output {
        answered();
        let mut next = pin!(next);
        let out = match futures::poll!(next.as_mut()) {
            Poll::Ready(out) => out,
            Poll::Pending if self.0 => {
                tokio::select! {
                    biased;
                    out = next.as_mut() => out,
                    () = tokio::time::sleep(ACTIVE_FOR) => {
                        self.set(false);
                        next.await
                    }
                }
            }
            Poll::Pending => next.await,
        };
        self.set(true);
        out
    }

    fn set(&mut self, active: bool) {
        if self.0 != active {
            self.0 = active;
            if active {
                ACTIVE_ON_NODE.fetch_add(1, Ordering::Relaxed);
            } else {
                ACTIVE_ON_NODE.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }
}

impl Drop for Active {
    fn drop(&mut self) {
        self.set(false);
    }
}

/// Whether a thread with a session waiting for its commit since `since` polls, when
/// `on_node` sessions of the node wait for theirs. (A thread with none polls after an
/// answer only while `on_node` ≤ 1.)
fn polls_for_commit(on_node: usize, since: Instant) -> bool {
    on_node == 1 && since.elapsed() < COMMIT_POLL_MAX
}

fn open(window: Duration) -> bool {
    let on_node = COMMITTING_ON_NODE.load(Ordering::Relaxed);
    match COMMITTING.get() {
        (0, _) | (_, None) => {}
        (_, Some(since)) => return polls_for_commit(on_node, since),
    }
    on_node <= 1
        && few_active()
        && ANSWERED
            .get()
            .is_some_and(|at| at.elapsed() < window && !durable_answer(at, window))
}

/// Whether the answer of `at` closed a durable statement: one whose commit this thread
/// saw end within `window` before it.
fn durable_answer(at: Instant, window: Duration) -> bool {
    COMMITTED
        .get()
        .is_some_and(|done| at.saturating_duration_since(done) < window)
}

/// Whether threads poll after an answer while `active` sessions of the node are active,
/// with at most `max` (`ACTIVE_POLL_MAX`).
fn polls_after_answers(active: usize, max: usize) -> bool {
    active <= max
}

/// `polls_after_answers` for the node now.
fn few_active() -> bool {
    polls_after_answers(ACTIVE_ON_NODE.load(Ordering::Relaxed), *ACTIVE_POLL_MAX)
}

/// The poller of one session thread: runs forever on that thread's runtime.
pub async fn poll(window: Duration) {
    loop {
        poll_fn(|cx| {
            if open(window) {
                Poll::Ready(())
            } else {
                POLLER.set(Some(cx.waker().clone()));
                Poll::Pending
            }
        })
        .await;
        while open(window) {
            tokio::task::yield_now().await;
            ROUNDS.set(ROUNDS.get() + 1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tests that count active sessions, or need none, run one at a time.
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn a_session_is_active_from_a_message_until_it_waits_long() {
        let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let active = || ACTIVE_ON_NODE.load(Ordering::Relaxed);
        runtime().block_on(async {
            let before = active();
            let mut session = Active::default();
            session.next(async {}).await;
            assert_eq!(active(), before + 1, "a message makes the session active");
            session.next(async {}).await;
            assert_eq!(active(), before + 1, "counted once");
            // The next message comes late: the session leaves while it waits, but not
            // before it has waited ACTIVE_FOR. (The wait is polled, not slept for a fixed
            // time: on a loaded machine both timers can fire in the same tick, and then
            // `join!` may look before the session's own timer has run.)
            let (send, late) = tokio::sync::oneshot::channel::<()>();
            let waiting = Instant::now();
            let during = async {
                while active() != before && waiting.elapsed() < Duration::from_secs(10) {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                let (during, waited) = (active(), waiting.elapsed());
                send.send(()).unwrap();
                (during, waited)
            };
            let (message, (during, waited)) = tokio::join!(session.next(late), during);
            message.unwrap();
            assert_eq!(during, before, "still active after waiting ACTIVE_FOR");
            assert!(
                waited >= ACTIVE_FOR,
                "left after {waited:?}, before ACTIVE_FOR"
            );
            assert_eq!(active(), before + 1, "active again with the message");
            drop(session);
            assert_eq!(active(), before, "a closed session is not active");
        });
    }

    #[test]
    fn threads_poll_after_answers_only_with_few_active_sessions() {
        assert!(polls_after_answers(0, 1));
        assert!(polls_after_answers(1, 1), "a lone client keeps its polling");
        assert!(
            !polls_after_answers(2, 1),
            "two clients on two cores: the cores go to the clients"
        );
        assert!(polls_after_answers(4, 4));
        assert!(!polls_after_answers(16, 4));
        assert!(*ACTIVE_POLL_MAX >= 1);
    }

    #[test]
    fn the_window_opens_when_a_session_answers_and_closes_after() {
        let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        std::thread::spawn(|| {
            // Long against the host taking the core away between two lines.
            let window = Duration::from_millis(100);
            assert!(!open(window), "closed before any answer");
            answered();
            assert!(open(window));
            std::thread::sleep(window);
            assert!(!open(window));
            // A session waiting for its commit holds it open, for a millisecond at most
            // (other tests of the process may commit too: see `polls_for_commit` below).
            let committing = Committing::start();
            let second = Committing::start();
            drop(second);
            assert_eq!(COMMITTING.get().0, 1, "one session still waits");
            std::thread::sleep(COMMIT_POLL_MAX);
            assert!(!open(window), "polled past COMMIT_POLL_MAX");
            drop(committing);
            assert_eq!(COMMITTING.get(), (0, None));
            // The answer of the statement that committed opens no window.
            answered();
            assert!(!open(window), "polled after a durable statement's answer");
            std::thread::sleep(window);
            answered();
            assert!(open(window), "a later answer opens the window again");
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_thread_polls_for_a_commit_only_while_it_is_the_nodes_only_one() {
        let now = Instant::now();
        assert!(polls_for_commit(1, now));
        assert!(
            !polls_for_commit(2, now),
            "two commits wait: the cores go to the committer"
        );
        assert!(!polls_for_commit(16, now));
        let long_ago = now - COMMIT_POLL_MAX;
        assert!(
            !polls_for_commit(1, long_ago),
            "polled past COMMIT_POLL_MAX"
        );
    }

    #[test]
    fn the_poller_runs_while_the_window_is_open_and_sleeps_after() {
        let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        runtime().block_on(async {
            // Windows and pauses are long against the host taking the core away: a
            // loaded run saw a round end 20 ms after it began, and a 5 ms window can
            // close before the poller first runs.
            let window = Duration::from_millis(50);
            let past_window = window * 4;
            let poller = tokio::spawn(poll(window));
            let rounds_after = |pause| async move {
                tokio::time::sleep(pause).await;
                ROUNDS.get()
            };
            let idle = rounds_after(Duration::from_millis(20)).await;
            assert_eq!(idle, 0, "polled with no session answering");
            answered();
            let polled = rounds_after(past_window).await;
            assert!(polled > 0, "did not poll after an answer");
            let later = rounds_after(Duration::from_millis(20)).await;
            assert_eq!(later, polled, "still polling after the window closed");
            answered();
            let again = rounds_after(past_window).await;
            assert!(again > later);
            // More active sessions than ACTIVE_POLL_MAX: an answer opens no window.
            let mut sessions: Vec<Active> = Vec::new();
            for _ in 0..=*ACTIVE_POLL_MAX {
                let mut session = Active::default();
                session.next(async {}).await;
                sessions.push(session);
            }
            // (Each `next` answered, and the first opened a window: let it close.)
            let busy = rounds_after(past_window).await;
            answered();
            assert_eq!(rounds_after(past_window).await, busy);
            drop(sessions);
            answered();
            assert!(rounds_after(past_window).await > busy);
            poller.abort();
        });
    }
}
