//! Prometheus metrics of the collector (`oomtrace collect --metrics ADDR`,
//! `--metrics-textfile PATH`; the names and labels are in docs/metrics.md).
//!
//! The connections never render anything: each publishes a small [`ProcessSnapshot`] of what
//! the metrics need into the shared [`Registry`] at most every [`PUBLISH_EVERY`] and once at
//! its end, never per event, so that a scrape costs the hot path nothing. The HTTP thread
//! ([`http`]) and the textfile writer ([`textfile`]) render the registry's snapshots
//! ([`exposition`]).
//!
//! The top layer of the crate (beside the server): reads the model, the analysis and the
//! report's symbolization; nothing below imports it.

pub mod exposition;
pub mod http;
pub mod names;
pub mod snapshot;
pub mod textfile;

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

pub use names::{Asked, Names};
pub use snapshot::ProcessSnapshot;

use crate::trace_writer::SharedFailure;

/// How often a connection publishes its snapshot while events arrive (and once at its end).
pub const PUBLISH_EVERY: Duration = Duration::from_millis(500);

/// Processes that have ended and stay exported with their final values: the most recent ones,
/// so that a long-lived collector's series stay bounded.
pub const ENDED_KEPT: usize = 64;

/// The snapshots of every process, and the collector's own counters. Shared by the connections
/// (which publish), the HTTP thread and the textfile writer (which render).
#[derive(Debug)]
pub struct Registry {
    inner: Mutex<Inner>,
    /// Unix time the collector started, seconds.
    pub start_time_s: f64,
    /// Connections open now.
    pub connected: AtomicU64,
    /// Events applied, all processes (added per read, never per event).
    pub events: AtomicU64,
    /// Renders served (HTTP scrapes and textfile writes).
    pub scrapes: AtomicU64,
    /// Nanoseconds the last render took.
    pub last_render_ns: AtomicU64,
    /// The trace writer's failure, once the server runs.
    failure: Mutex<Option<SharedFailure>>,
    /// Call-site names, made off the connections' threads.
    pub names: Arc<Names>,
}

#[derive(Debug, Default)]
struct Inner {
    /// By connection.
    running: BTreeMap<u32, Arc<ProcessSnapshot>>,
    /// Oldest first, at most [`ENDED_KEPT`].
    ended: VecDeque<Arc<ProcessSnapshot>>,
}

impl Default for Registry {
    fn default() -> Self {
        Registry::new()
    }
}

impl Registry {
    pub fn new() -> Registry {
        Registry {
            inner: Mutex::default(),
            start_time_s: SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map(|d| d.as_secs_f64())
                .unwrap_or(0.0),
            connected: AtomicU64::new(0),
            events: AtomicU64::new(0),
            scrapes: AtomicU64::new(0),
            last_render_ns: AtomicU64::new(0),
            failure: Mutex::new(None),
            names: Arc::default(),
        }
    }

    /// The server hands over its writer's failure state (health metrics read it).
    pub fn set_failure(&self, failure: SharedFailure) {
        *self.failure.lock().unwrap_or_else(|p| p.into_inner()) = Some(failure);
    }

    /// Whether the trace writer failed, and the events it could not write since.
    pub fn write_failure(&self) -> (u64, u64) {
        let shared = self
            .failure
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let Some(shared) = shared else {
            return (0, 0);
        };
        let state = shared.lock().unwrap_or_else(|p| p.into_inner());
        let unwritten = state.unwritten.values().map(|u| u.events).sum();
        (u64::from(state.failure.is_some()), unwritten)
    }

    /// Replaces the snapshot of `s.conn`. A snapshot of an ended process moves to the ended
    /// list (the oldest dropped past [`ENDED_KEPT`]).
    pub fn publish(&self, s: ProcessSnapshot) {
        let s = Arc::new(s);
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        // A newer image of the same pid (an exec) replaces the ended one: one series per pid.
        // (The same connection's own earlier snapshot goes too, its names stay.)
        let names = &self.names;
        inner.ended.retain(|e| {
            let keep = e.pid != s.pid;
            if !keep && e.conn != s.conn {
                names.forget(e.conn);
            }
            keep
        });
        if s.running {
            inner.running.insert(s.conn, s);
        } else {
            inner.running.remove(&s.conn);
            inner.ended.push_back(s);
            while inner.ended.len() > ENDED_KEPT {
                if let Some(gone) = inner.ended.pop_front() {
                    self.names.forget(gone.conn);
                }
            }
        }
    }

    /// Every snapshot, one per pid (the latest connection of a pid wins), by pid.
    pub fn snapshots(&self) -> Vec<Arc<ProcessSnapshot>> {
        let inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let mut by_pid: BTreeMap<u32, Arc<ProcessSnapshot>> = BTreeMap::new();
        for s in inner.ended.iter().chain(inner.running.values()) {
            match by_pid.get(&s.pid) {
                Some(old) if old.conn > s.conn => {}
                _ => {
                    by_pid.insert(s.pid, s.clone());
                }
            }
        }
        by_pid.into_values().collect()
    }

    /// The exposition text of everything now (counts as a scrape).
    pub fn render(&self) -> String {
        let started = std::time::Instant::now();
        self.scrapes.fetch_add(1, Ordering::Relaxed);
        let text = exposition::render(self);
        self.last_render_ns
            .store(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        text
    }
}

/// A call site's stable short id: 12 hex digits of the FNV-1a hash of its key (the symbolized
/// frames of `report::sections::site_key`, by which `oomtrace diff` matches sites across
/// runs), so that the same code has the same id in every run and on every rank. FNV because
/// its value is fixed by its definition, unlike std's hasher.
pub fn site_id(key: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{:012x}", h >> 16)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::SiteId;

    fn snap(conn: u32, pid: u32, running: bool) -> ProcessSnapshot {
        ProcessSnapshot {
            conn,
            pid,
            running,
            ..Default::default()
        }
    }

    #[test]
    fn site_ids_are_stable_and_short() {
        assert_eq!(site_id("a <- b"), site_id("a <- b"));
        assert_ne!(site_id("a <- b"), site_id("a <- c"));
        assert_eq!(site_id("").len(), 12);
        // Fixed by FNV-1a's definition: the offset basis, top 48 bits.
        assert_eq!(site_id(""), "cbf29ce48422");
    }

    #[test]
    fn ended_processes_are_bounded_and_one_per_pid() {
        let r = Registry::new();
        for i in 0..(ENDED_KEPT as u32 + 10) {
            r.publish(snap(i + 1, 1000 + i, true));
            r.publish(snap(i + 1, 1000 + i, false));
        }
        let s = r.snapshots();
        assert_eq!(s.len(), ENDED_KEPT);
        assert_eq!(s[0].pid, 1010);
        // An exec: the same pid on a new connection replaces the old image.
        r.publish(snap(500, 1050, true));
        let s = r.snapshots();
        assert_eq!(s.iter().filter(|s| s.pid == 1050).count(), 1);
        assert!(s
            .iter()
            .any(|s| s.pid == 1050 && s.conn == 500 && s.running));
    }

    #[test]
    fn a_connection_publishing_its_end_twice_keeps_its_site_names() {
        let r = Registry::new();
        let name = ("0123456789ab".to_string(), "x.c:1 f".to_string());
        r.names.insert(7, SiteId(1), name);
        r.publish(snap(7, 70, false));
        r.publish(snap(7, 70, false));
        assert!(r.names.get(7, SiteId(1)).is_some());
        // A new image of pid 70 (an exec) drops the old connection's names with it.
        r.publish(snap(8, 70, true));
        assert!(r.names.get(7, SiteId(1)).is_none());
    }
}
