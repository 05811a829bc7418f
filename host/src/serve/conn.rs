//! One connection's guard: its IO records activity, so an idle connection is closed, and a
//! write the peer does not take within a bound fails, so a client that stopped reading (a
//! stalled event stream) frees its connection instead of holding it forever.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

/// When the connection last moved a byte, in milliseconds since `origin`, and whether the peer
/// ever sent one.
#[derive(Debug)]
pub(crate) struct Activity {
    origin: Instant,
    last_ms: AtomicU64,
    heard: AtomicBool,
}

impl Activity {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Self {
            origin: Instant::now(),
            last_ms: AtomicU64::new(0),
            heard: AtomicBool::new(false),
        })
    }

    /// True once the peer sent a byte.
    pub(crate) fn heard(&self) -> bool {
        self.heard.load(Ordering::Relaxed)
    }

    fn touch(&self) {
        let ms = u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.store(ms, Ordering::Relaxed);
    }

    /// How long no byte moved.
    pub(crate) fn idle_for(&self) -> Duration {
        let last = Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
        self.origin.elapsed().saturating_sub(last)
    }
}

/// An IO that records activity and fails a write pending longer than `stall`.
pub(crate) struct Guarded<T> {
    inner: T,
    activity: Arc<Activity>,
    stall: Duration,
    stalled_since: Option<Pin<Box<Sleep>>>,
}

impl<T> Guarded<T> {
    pub(crate) fn new(inner: T, activity: Arc<Activity>, stall: Duration) -> Self {
        Self {
            inner,
            activity,
            stall,
            stalled_since: None,
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Guarded<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.touch();
            self.activity.heard.store(true, Ordering::Relaxed);
        }
        polled
    }
}

impl<T: AsyncWrite + Unpin> Guarded<T> {
    fn pending_write<R>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<R>> {
        let stall = self.stall;
        let timer = self
            .stalled_since
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(stall)));
        if timer.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the peer took no bytes for the write timeout",
            )));
        }
        Poll::Pending
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Guarded<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match Pin::new(&mut self.inner).poll_write(cx, buf) {
            Poll::Pending => self.pending_write(cx),
            ready => {
                self.stalled_since = None;
                self.activity.touch();
                ready
            }
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match Pin::new(&mut self.inner).poll_flush(cx) {
            Poll::Pending => self.pending_write(cx),
            ready => {
                self.stalled_since = None;
                ready
            }
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// The open connections, for closing the oldest silent one when all permits are taken: a flood
/// of connections that never send a byte must not lock a real client out until their header
/// timeouts run (10 s per round of `--max-connections`).
#[derive(Debug, Default)]
pub(crate) struct Registry {
    open: std::sync::Mutex<std::collections::BTreeMap<u64, Arc<Slot>>>,
    next: AtomicU64,
}

/// One open connection's entry.
#[derive(Debug)]
pub(crate) struct Slot {
    pub(crate) activity: Arc<Activity>,
    pub(crate) evict: tokio::sync::Notify,
}

/// Removes its connection from the registry when the connection ends.
pub(crate) struct Registered {
    registry: Arc<Registry>,
    id: u64,
    pub(crate) slot: Arc<Slot>,
}

impl Drop for Registered {
    fn drop(&mut self) {
        let mut open = self.registry.open.lock().unwrap_or_else(|p| p.into_inner());
        open.remove(&self.id);
    }
}

impl Registry {
    /// Registers a new connection.
    pub(crate) fn register(self: &Arc<Self>) -> Registered {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let slot = Arc::new(Slot {
            activity: Activity::new(),
            evict: tokio::sync::Notify::new(),
        });
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        open.insert(id, slot.clone());
        Registered {
            registry: self.clone(),
            id,
            slot,
        }
    }

    /// Asks the oldest connection that never sent a byte to close; false when there is none.
    pub(crate) fn evict_oldest_silent(&self) -> bool {
        let open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        match open.values().find(|slot| !slot.activity.heard()) {
            Some(slot) => {
                slot.evict.notify_one();
                true
            }
            None => false,
        }
    }
}
