//! Call-site names for the metrics (`site` id and `location`), made on a thread of their own.
//!
//! Symbolizing a site the first time reads its module's symbols and DWARF from disk: tens of
//! milliseconds, seconds for a library the size of PyTorch's. A connection thread that did
//! it would stop reading its process meanwhile (and the shim, its queue full, would make the
//! program wait), so the connection only sends the site's frames, with the modules and code
//! objects they name, to this thread ([`Names::ask`]: a copy of a few frames, once per site)
//! and goes on. Renders name the sites already named and leave out the rest until they are.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Sender, TrySendError};
use oomtrace_proto::python::CodeDef;
use oomtrace_proto::python::PyFrame;
use rustc_hash::{FxHashMap, FxHashSet};

use crate::model::{Module, Process, RawFrame, SiteId, Stacks};
use crate::report::sections::site_key;
use crate::report::symbolize::{culprit, FrameInfo, StackSymbolizer};

/// Sites waiting to be named, at most; a site that does not fit is asked again at the next
/// publication.
const QUEUE: usize = 4096;

/// (id, location) of a site.
pub type Name = (String, String);

/// One site's frames and what they name: enough to symbolize it apart from its process.
struct Job {
    conn: u32,
    site: SiteId,
    frames: Vec<RawFrame>,
    modules: Vec<Module>,
    codes: FxHashMap<u32, CodeDef>,
}

#[derive(Debug, Default)]
pub struct Names {
    known: Mutex<FxHashMap<(u32, SiteId), Name>>,
    /// The naming thread's queue; None if it could not be started.
    jobs: OnceLock<Option<Sender<Job>>>,
    /// Jobs sent and not yet done.
    pending: AtomicUsize,
}

/// How a site's location reads: the culprit frame as the report names it, `file:line
/// function`, or the function (or module+offset) of a native frame without lines.
pub fn location(stack: &[FrameInfo]) -> String {
    match culprit(stack).or(stack.first()) {
        None => "(no stack)".into(),
        Some(f) if !f.file.is_empty() => format!("{}:{} {}", f.file, f.line, f.function),
        Some(f) if !f.function.is_empty() => f.function.clone(),
        Some(f) if !f.module.is_empty() => format!("{}+{}", f.module, f.offset),
        Some(f) => f.address.clone(),
    }
}

/// What one connection has asked for (so that each site is sent once).
#[derive(Debug, Default)]
pub struct Asked(FxHashSet<SiteId>);

impl Names {
    /// The name of `site` of connection `conn`, once made.
    pub fn get(&self, conn: u32, site: SiteId) -> Option<Name> {
        self.lock().get(&(conn, site)).cloned()
    }

    /// Runs `f` with every name made so far (one lock for a whole render).
    pub fn with<R>(&self, f: impl FnOnce(&FxHashMap<(u32, SiteId), Name>) -> R) -> R {
        f(&self.lock())
    }

    /// Records a name (the naming thread; tests).
    pub fn insert(&self, conn: u32, site: SiteId, name: Name) {
        self.lock().insert((conn, site), name);
    }

    /// Drops the names of a connection no longer exported.
    pub fn forget(&self, conn: u32) {
        self.lock().retain(|(c, _), _| *c != conn);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, FxHashMap<(u32, SiteId), Name>> {
        self.known.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Has `site` of `p` named, unless it was asked already. Cheap: copies the site's frames
    /// and the few modules and code objects they name, never symbolizes.
    pub fn ask(self: &Arc<Self>, asked: &mut Asked, p: &Process, site: SiteId) {
        if asked.0.contains(&site) {
            return;
        }
        let Some(tx) = self.jobs.get_or_init(|| self.start()) else {
            return;
        };
        let Some(raw) = p.sites.get(site.0 as usize) else {
            return;
        };
        let mut modules: Vec<Module> = Vec::new();
        let mut index: FxHashMap<usize, usize> = FxHashMap::default();
        let mut codes: FxHashMap<u32, CodeDef> = FxHashMap::default();
        let frames = raw
            .iter()
            .map(|f| {
                if let Some(py) = PyFrame::decode(f.addr) {
                    if let Some(c) = p.codes.get(&py.code) {
                        codes.entry(py.code).or_insert_with(|| c.clone());
                    }
                }
                let module = f.module.and_then(|m| {
                    let def = p.modules.get(m)?;
                    Some(*index.entry(m).or_insert_with(|| {
                        modules.push(def.clone());
                        modules.len() - 1
                    }))
                });
                RawFrame {
                    addr: f.addr,
                    module,
                }
            })
            .collect();
        let job = Job {
            conn: p.conn,
            site,
            frames,
            modules,
            codes,
        };
        self.pending.fetch_add(1, Ordering::AcqRel);
        match tx.try_send(job) {
            Ok(()) => {
                asked.0.insert(site);
            }
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.pending.fetch_sub(1, Ordering::AcqRel);
            }
        }
    }

    /// Waits (at most `limit`) until every site asked for is named: the final values.
    pub fn settle(&self, limit: Duration) {
        let start = Instant::now();
        while self.pending.load(Ordering::Acquire) > 0 && start.elapsed() < limit {
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The naming thread. It holds the names weakly: it ends with them (their queue's sender
    /// goes with them).
    fn start(self: &Arc<Self>) -> Option<Sender<Job>> {
        let (tx, rx) = bounded::<Job>(QUEUE);
        let names: Weak<Names> = Arc::downgrade(self);
        std::thread::Builder::new()
            .name("oomtrace-names".into())
            .spawn(move || {
                let mut sym = StackSymbolizer::new();
                for job in rx {
                    let sites = [Vec::new(), job.frames];
                    let stacks = Stacks {
                        sites: &sites,
                        modules: &job.modules,
                        codes: &job.codes,
                        // Live streams come from the shim, which names no frame.
                        named: &Default::default(),
                    };
                    let stack = sym.site(stacks, SiteId(1));
                    let name = (super::site_id(&site_key(&stack)), location(&stack));
                    let Some(names) = names.upgrade() else {
                        return;
                    };
                    names.insert(job.conn, job.site, name);
                    names.pending.fetch_sub(1, Ordering::AcqRel);
                }
            })
            .ok()
            .map(|_| tx)
    }
}
