//! A producer whose delivery reports are served by a thread that sleeps until librdkafka
//! queues one. rdkafka's `ThreadedProducer` polls in 100 ms rounds and spends the end of
//! each spinning: its deadline's remainder is rounded down to a 0 ms wait, so the last
//! millisecond is a busy loop of non-blocking polls. Each idle producer took about 0.9 %
//! of a core that way (45 ms of CPU in 5 s, `perf stat --per-thread`), seven per node.
//!
//! Here librdkafka writes to an eventfd when the producer's queue goes from empty to not
//! (`rd_kafka_queue_io_event_enable`, once per period between two polls). The thread
//! waits on it and on a second eventfd that stops it, then serves the queue until it is
//! empty. A report queued after the thread saw the queue empty was queued on an empty
//! queue after a poll, so it writes the eventfd again: none waits for a timer.
//!
//! It calls librdkafka's queue API and two syscalls directly, hence `unsafe`.
#![allow(unsafe_code)]

use std::ops::Deref;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use rdkafka::bindings as rdsys;
use rdkafka::config::{ClientConfig, FromClientConfig, FromClientConfigAndContext};
use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::producer::{BaseProducer, DefaultProducerContext, Producer, ProducerContext};

/// A `BaseProducer` with its own serving thread (see the module's text). It derefs to the
/// producer, so it sends, flushes and runs transactions as one. Clones share the
/// producer; the last one dropped stops the thread.
pub(super) struct Polled<C: ProducerContext + 'static>(Arc<Serving<C>>);

/// What the clones share: the producer, and the eventfd and thread that serve it.
struct Serving<C: ProducerContext + 'static> {
    producer: Arc<BaseProducer<C>>,
    stop: Arc<OwnedFd>,
    thread: Option<JoinHandle<()>>,
}

impl<C: ProducerContext + 'static> Clone for Polled<C> {
    fn clone(&self) -> Polled<C> {
        Polled(self.0.clone())
    }
}

/// A handle on a producer's main queue, made and dropped by its serving thread.
struct Queue(*mut rdsys::rd_kafka_queue_t);

impl Drop for Queue {
    fn drop(&mut self) {
        // SAFETY: the handle is live, and the producer outlives it (the thread holds both,
        // and drops the queue first).
        unsafe {
            rdsys::rd_kafka_queue_io_event_enable(self.0, -1, std::ptr::null(), 0);
            rdsys::rd_kafka_queue_destroy(self.0);
        }
    }
}

fn eventfd() -> KafkaResult<OwnedFd> {
    // SAFETY: a plain syscall; a valid fd is owned from here on.
    let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    if fd < 0 {
        let e = std::io::Error::last_os_error();
        return Err(KafkaError::ClientCreation(format!("eventfd: {e}")));
    }
    // SAFETY: `fd` was just opened and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Takes what was written to an eventfd, so that the next write wakes a poll again.
fn take(fd: &OwnedFd) {
    let mut n = 0u64;
    // SAFETY: reads 8 bytes into `n`; a nonblocking eventfd with nothing written fails
    // with EAGAIN, which is fine.
    unsafe { libc::read(fd.as_raw_fd(), (&mut n as *mut u64).cast(), 8) };
}

fn serve<C: ProducerContext + 'static>(
    producer: Arc<BaseProducer<C>>,
    wake: OwnedFd,
    stop: Arc<OwnedFd>,
) {
    // SAFETY: the producer's handle is live while `producer` is held.
    let queue = Queue(unsafe { rdsys::rd_kafka_queue_get_main(producer.client().native_ptr()) });
    static ONE: u64 = 1;
    // SAFETY: librdkafka copies the payload; `wake` stays open until the queue handle,
    // which turns the writes off, is dropped below.
    unsafe {
        rdsys::rd_kafka_queue_io_event_enable(
            queue.0,
            wake.as_raw_fd(),
            (&ONE as *const u64).cast(),
            8,
        )
    };
    loop {
        take(&wake);
        // Each non-blocking poll hands over one event or empties the queue.
        // SAFETY: the queue handle is live.
        while unsafe { rdsys::rd_kafka_queue_length(queue.0) } > 0 {
            producer.poll(Duration::ZERO);
        }
        let mut fds = [&wake, &*stop].map(|fd| libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        });
        // SAFETY: two valid pollfds. EINTR and spurious wakes just serve the queue again.
        unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        if fds[1].revents != 0 {
            break;
        }
    }
    drop(queue);
    drop(wake);
}

impl<C: ProducerContext + 'static> FromClientConfigAndContext<C> for Polled<C> {
    fn from_config_and_context(config: &ClientConfig, context: C) -> KafkaResult<Polled<C>> {
        let producer = Arc::new(BaseProducer::from_config_and_context(config, context)?);
        let (wake, stop) = (eventfd()?, Arc::new(eventfd()?));
        let thread = {
            let (producer, stop) = (producer.clone(), stop.clone());
            std::thread::Builder::new()
                .name("eddy-producer".into())
                .spawn(move || serve(producer, wake, stop))
                .map_err(|e| KafkaError::ClientCreation(format!("a producer's thread: {e}")))?
        };
        Ok(Polled(Arc::new(Serving {
            producer,
            stop,
            thread: Some(thread),
        })))
    }
}

impl FromClientConfig for Polled<DefaultProducerContext> {
    fn from_config(config: &ClientConfig) -> KafkaResult<Polled<DefaultProducerContext>> {
        Polled::from_config_and_context(config, DefaultProducerContext)
    }
}

impl<C: ProducerContext + 'static> Deref for Polled<C> {
    type Target = BaseProducer<C>;

    fn deref(&self) -> &BaseProducer<C> {
        &self.0.producer
    }
}

impl<C: ProducerContext + 'static> Drop for Serving<C> {
    /// Stops the thread; the producer then drops as a `BaseProducer` does (it purges what
    /// is queued and serves the reports that makes).
    fn drop(&mut self) {
        let one = 1u64;
        // SAFETY: writes 8 bytes to a live eventfd.
        unsafe { libc::write(self.stop.as_raw_fd(), (&one as *const u64).cast(), 8) };
        // A report's handler may drop the last clone on the thread itself: it then ends
        // once the handler returns, unjoined.
        if let Some(thread) = self.thread.take() {
            if thread.thread().id() != std::thread::current().id() {
                let _ = thread.join();
            }
        }
    }
}
