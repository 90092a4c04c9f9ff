//! Epochs: the iterations a leak is measured in (docs/detection.md).
//!
//! One clock per process, fed in stream order, deterministic, so a live collector and a
//! replay of its trace agree on every boundary (time here is the trace's timestamps, never
//! the collector's clock). Sources, best first:
//! 1. **Markers** (`oomtrace_mark`): each marker ends an epoch. Once one is seen, markers rule.
//! 2. **Auto**: an *anchor*, a call site that allocates once per iteration of its thread's
//!    loop; each of its allocations then starts an epoch. Candidates are (thread, call site)
//!    pairs, each followed in its own thread's allocations, so threads with their own loops
//!    do not blur each other. Two kinds, structural first:
//!    - **structural**: between two allocations of the site, the *set* of other call sites
//!      that allocated on the thread (its segment's signature) is the same in at least
//!      `ANCHOR_MIN_SEGMENTS` of its last 8 segments, and not empty. How many allocations each makes
//!      does not matter, so an iteration with a varying number of temporaries keeps its
//!      anchor, while a site inside an inner loop (layers) sees alternately nothing and the
//!      rest of the iteration and never qualifies.
//!    - **cycle** (the sanity rule for loops whose iterations alternate, `if i % 2: ...`):
//!      the site's last `RING` signatures repeat with a period of 2 or 3 segments (not one:
//!      that is structural), and its segments are alike in size: each holds at least half as
//!      many distinct sites as the largest, and each lasts at least half as long as the
//!      longest (`CYCLE_BALANCE`). The loop's head allocates once per iteration whichever
//!      branch ran, so it qualifies, and with the shortest period it is chosen over a site of
//!      one branch (which allocates every second iteration, and made a loop of N iterations
//!      N/2 steps); a site of an inner loop that alternates between a layer's few sites and
//!      the rest of the iteration is unbalanced and does not.
//!    - **paced**: a site whose allocations come at a steady pace in time (all but two of its
//!      last 8 gaps within `PACED_TOLERANCE` of their median) at least `PACED_MIN_NS` apart: one
//!      allocation per step (period 1, where the order of events says nothing), or a sparse
//!      stream whose other allocations come and go. The floor tells a step, which computes,
//!      from a tight allocation loop (an initialization), which is microseconds apart.
//!
//!    The anchor is a structural candidate that allocates near the trough of live bytes (a
//!    site in a layer loop with two sites per layer also repeats its signature, but
//!    allocates while activations pile up), with the shortest period among those (a site
//!    that allocates every third step qualifies too), then the lowest live bytes; a paced one
//!    only when no structural one qualifies. It is re-validated at each of its
//!    allocations: a structural anchor whose signature differs `ANCHOR_MISSES` times in a
//!    row, a paced one whose gaps leave [⅓, 3] × its pace 3 times in a row, or one whose
//!    thread made `ANCHOR_SILENT_GAPS` times its longest recent gap without it (a phase
//!    change: training ends, evaluation starts; or `ANCHOR_SILENT_PERIODS` of its periods in
//!    the process's allocations: its thread stopped) is dropped; another that qualified meanwhile locks at its next allocation. A site dropped
//!    `MAX_DROPS` times is never an anchor again (a burst that keeps looking regular).
//! 3. **Time**: otherwise, a window of at least `WINDOW_MIN_NS` (or `WINDOW_GAP_FACTOR` times
//!    the median gap between allocations, for streams of a few allocations per minute), closed
//!    at a trough: at the first allocation once the window is long enough that finds the
//!    device's live bytes within 1/8 of the window's range above its lowest point (at the
//!    latest after two window lengths). Samples at troughs do not rise with memory that only
//!    fluctuates (threads allocating and freeing at their own pace).
//!
//! Epochs before the clock became stable count as warm-up (`stable_since`), so the false
//! epochs of a wrong first lock never make a leak. How sure the clock is of its steps is
//! [`EpochClock::confidence`].

use std::collections::VecDeque;

use rustc_hash::FxHashMap;

use crate::model::SiteId;

/// Segments (and gaps) kept per candidate.
const RING: usize = 8;
/// Segments of the last `RING` with the same signature that make a structural anchor.
const ANCHOR_MIN_SEGMENTS: usize = 5;
/// A cycle's segments: each has at least this share of the largest's distinct sites, and of
/// the longest's duration.
const CYCLE_BALANCE: f64 = 0.5;
/// Distinct call sites hashed into a segment's signature: the most recent ones.
const SIGNATURE_SITES: usize = 32;
/// A paced anchor: all but `PACED_OUTLIERS` of its last `RING` gaps in time lie within this
/// share of their median (the others may be stalls of the thread: a loaded machine, a page
/// fault)...
const PACED_TOLERANCE: f64 = 0.5;
const PACED_OUTLIERS: usize = 2;
/// ...are at least this long on average (1 ms)...
const PACED_MIN_NS: f64 = 1e6;
/// ...and hold at most this many allocations of its thread on average: where more happen
/// between two of its allocations, their order is the evidence, not time.
const PACED_MAX_ALLOCS: f64 = 4.0;
/// Weight of the newest matching time gap in a paced anchor's pace.
const ANCHOR_EWMA: f64 = 0.2;
/// Mismatching segments (a structural anchor) or gaps outside [⅓, 3] × the pace (a paced
/// one) in a row that drop an anchor.
const ANCHOR_MISSES: u32 = 3;
/// An anchor is dropped when its thread made this many times its longest recent gap in
/// allocations without it (training ended, evaluation began)...
const ANCHOR_SILENT_GAPS: u64 = 2;
/// ...or the process this many of its periods (its thread stopped).
const ANCHOR_SILENT_PERIODS: f64 = 8.0;
/// Drops after which a site is never an anchor again.
const MAX_DROPS: u8 = 3;
/// Confidence of a structural anchor whose segments all match, and of a paced one.
const STRUCTURAL_CONFIDENCE: f64 = 0.9;
const PACED_CONFIDENCE: f64 = 0.7;
/// Confidence of time windows: a step of the program is not what they measure.
const TIME_CONFIDENCE: f64 = 0.3;
/// The shortest time window (1 s)...
const WINDOW_MIN_NS: u64 = 1_000_000_000;
/// ...or this many times the median gap between allocations, when longer.
const WINDOW_GAP_FACTOR: u64 = 8;
/// Gaps between allocations kept for that median.
const WINDOW_GAPS: usize = 64;
/// Threads and call sites per thread followed; beyond, new ones are not candidates.
const MAX_THREADS: usize = 1024;
const MAX_SITES_PER_THREAD: usize = 4096;
/// Epoch start times kept (for onset times).
const STARTS_KEPT: usize = 4096;
/// Epoch durations kept for the median.
const DURATIONS_KEPT: usize = 64;
/// A rate per second is only given over steps that span at least this much of the trace (1 s):
/// a few hundred milliseconds say nothing about a job's pace.
pub const RATE_MIN_SPAN_NS: u64 = 1_000_000_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EpochSource {
    /// No boundary yet.
    None,
    Markers,
    Auto,
    /// Time windows closed at troughs.
    Windows,
}

impl EpochSource {
    pub fn name(self) -> &'static str {
        match self {
            EpochSource::None => "none",
            EpochSource::Markers => "markers",
            EpochSource::Auto => "auto",
            EpochSource::Windows => "windows",
        }
    }
}

/// What made the anchor qualify.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AnchorKind {
    /// The same set of call sites between its allocations (that set's signature).
    Structural(u64),
    /// Sets of call sites that repeat in a cycle of 2 or 3 (iterations that alternate between
    /// branches): the cycle's signatures (the first `len` of them).
    Cycle { sigs: [u64; 3], len: u8 },
    /// A regular pace in time.
    Paced,
}

impl AnchorKind {
    /// Found by the order of events (structural, cycle), not by time (paced).
    pub fn by_structure(self) -> bool {
        !matches!(self, AnchorKind::Paced)
    }
}

/// One thread's recent allocations: its call sites in the order they last allocated (a
/// doubly linked list over `nodes`, newest at `newest`), to find the distinct sites between
/// two allocations of one: those after it in that order. An allocation moves its site to the
/// newest end in O(1), and the walk back from there stops at the site itself or after
/// `SIGNATURE_SITES` sites, whatever the number of sites the thread has.
///
/// Each followed site's candidate lives beside its node (`cands`, same index): the slot found
/// for the signature finds the candidate too, with no second lookup per allocation.
#[derive(Debug)]
struct Thread {
    tid: u32,
    idx: u64,
    slot: FxHashMap<SiteId, u32>,
    nodes: Vec<SiteNode>,
    cands: Vec<Option<Candidate>>,
    newest: u32,
}

/// A call site in its thread's recency list.
#[derive(Clone, Copy, Debug)]
struct SiteNode {
    /// `mix` of the site's id: its share of a signature.
    mixed: u64,
    site: SiteId,
    /// The next older and newer site, or `NONE`.
    older: u32,
    newer: u32,
}

const NONE: u32 = u32::MAX;

impl Thread {
    fn new(tid: u32) -> Thread {
        Thread {
            tid,
            idx: 0,
            slot: FxHashMap::default(),
            nodes: Vec::new(),
            cands: Vec::new(),
            newest: NONE,
        }
    }

    /// An allocation at `site`: its node (`NONE` when the thread has too many sites to follow
    /// a new one), and the signature of the segment since the site's previous allocation on
    /// this thread (0: nothing in between), or None the first time (or when not followed).
    fn observe(&mut self, site: SiteId) -> (u32, Option<(u64, u32)>) {
        self.idx += 1;
        let Some(&at) = self.slot.get(&site) else {
            if self.slot.len() < MAX_SITES_PER_THREAD {
                let at = self.nodes.len() as u32;
                self.nodes.push(SiteNode {
                    mixed: mix(u64::from(site.0)),
                    site,
                    older: NONE,
                    newer: NONE,
                });
                self.cands.push(None);
                self.slot.insert(site, at);
                self.make_newest(at);
                return (at, None);
            }
            return (NONE, None);
        };
        let mut sum = 0u64;
        let mut n = 0u64;
        let mut i = self.newest;
        while i != at && (n as usize) < SIGNATURE_SITES {
            let node = self.nodes[i as usize];
            sum = sum.wrapping_add(node.mixed);
            n += 1;
            i = node.older;
        }
        if self.newest != at {
            self.unlink(at);
            self.make_newest(at);
        }
        let sig = if n == 0 {
            0
        } else {
            sum.wrapping_add(n.wrapping_mul(0x9e37_79b9_7f4a_7c15)) | 1
        };
        (at, Some((sig, n as u32)))
    }

    fn unlink(&mut self, at: u32) {
        let SiteNode { older, newer, .. } = self.nodes[at as usize];
        if older != NONE {
            self.nodes[older as usize].newer = newer;
        }
        if newer != NONE {
            self.nodes[newer as usize].older = older;
        } else {
            self.newest = older;
        }
    }

    fn make_newest(&mut self, at: u32) {
        let old = self.newest;
        self.nodes[at as usize].older = old;
        self.nodes[at as usize].newer = NONE;
        if old != NONE {
            self.nodes[old as usize].newer = at;
        }
        self.newest = at;
    }
}

/// splitmix64's finalizer: sums of these tell sets of sites apart.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A (thread, call site) that may be an anchor: its last segments and gaps.
#[derive(Clone, Debug, Default)]
struct Candidate {
    sigs: [u64; RING],
    /// How many distinct sites each segment held.
    counts: [u32; RING],
    /// Gaps in the process's allocations, and in time (ns).
    gaps: [u64; RING],
    time_gaps: [u64; RING],
    /// Gaps in its own thread's allocations.
    local_gaps: [u64; RING],
    n: u64,
    last_idx: u64,
    last_local: u64,
    last_ts: u64,
    /// Device live bytes at its last allocations: an iteration starts at a trough.
    lives: [u64; RING],
    drops: u8,
    /// It qualified at its previous allocation.
    qualified: bool,
    /// [`Candidate::majority`] of `sigs` as they are, and the largest of `local_gaps`: kept
    /// as the rings change (an anchor's segments all match, so its pushes mostly replace a
    /// signature by the same one), not recounted at every allocation of the candidate.
    major: Option<u64>,
    max_local: u64,
}

impl Candidate {
    fn push(
        &mut self,
        (sig, count): (u64, u32),
        gap: u64,
        time_gap: u64,
        local_gap: u64,
        live: u64,
    ) {
        let k = (self.n % RING as u64) as usize;
        let full = self.n >= RING as u64;
        let (old_sig, old_local) = (self.sigs[k], self.local_gaps[k]);
        self.lives[k] = live;
        self.sigs[k] = sig;
        self.counts[k] = count;
        self.gaps[k] = gap;
        self.time_gaps[k] = time_gap;
        self.local_gaps[k] = local_gap;
        self.n += 1;
        if !(full && old_sig == sig) {
            self.major = self.majority();
        }
        if local_gap >= self.max_local || !full {
            self.max_local = self.max_local.max(local_gap);
        } else if old_local == self.max_local {
            // The largest left the ring: the next largest is among the others.
            self.max_local = self.local_gaps.iter().copied().max().unwrap_or(0);
        }
    }

    /// The filled part of a ring: its last (up to `RING`) entries, in no particular order
    /// (every use below is a count, a mean, a maximum or a median).
    fn filled<'a, T>(&self, ring: &'a [T; RING]) -> &'a [T] {
        &ring[..(self.n as usize).min(RING)]
    }

    /// The median of its recent time gaps (ns), and the gaps.
    fn pace(&self) -> (f64, [f64; RING], usize) {
        let g = self.filled(&self.time_gaps);
        let mut v = [0.0; RING];
        for (d, &x) in v.iter_mut().zip(g) {
            *d = x as f64;
        }
        let n = g.len();
        (super::stats::median(&mut v[..n]), v, n)
    }

    /// The signature of most of its last segments (at least `ANCHOR_MIN_SEGMENTS` of them),
    /// if not empty: an optional site in some iterations (an eval every third step) does
    /// not hide the iteration.
    ///
    /// `ANCHOR_MIN_SEGMENTS` of at most `RING` is more than half: such a signature is the
    /// ring's majority, found in one pass (Boyer-Moore) and then counted, not by counting
    /// every entry against every other (this runs whenever the ring's signatures change).
    fn majority(&self) -> Option<u64> {
        const _: () = assert!(2 * ANCHOR_MIN_SEGMENTS > RING);
        let s = self.filled(&self.sigs);
        let mut major = 0;
        let mut lead = 0usize;
        for &x in s {
            if lead == 0 {
                major = x;
                lead = 1;
            } else if x == major {
                lead += 1;
            } else {
                lead -= 1;
            }
        }
        let count = s.iter().filter(|&&y| y == major).count();
        (major != 0 && count >= ANCHOR_MIN_SEGMENTS).then_some(major)
    }

    fn paced(&self) -> bool {
        if (self.n as usize) < RING {
            return false;
        }
        let per_step = self.filled(&self.local_gaps).iter().sum::<u64>() as f64 / RING as f64;
        // The cheap test first: the median below sorts.
        if per_step > PACED_MAX_ALLOCS {
            return false;
        }
        // The median is at least PACED_MIN_NS only when half the gaps (rounded up) are: a
        // tight loop, whose gaps are microseconds, is told without the sort.
        let gaps = self.filled(&self.time_gaps);
        let long = gaps.iter().filter(|&&x| x as f64 >= PACED_MIN_NS).count();
        if long < gaps.len().div_ceil(2) {
            return false;
        }
        let (m, g, n) = self.pace();
        let off = g[..n]
            .iter()
            .filter(|&&x| (x - m).abs() > PACED_TOLERANCE * m)
            .count();
        m >= PACED_MIN_NS && off <= PACED_OUTLIERS && per_step <= PACED_MAX_ALLOCS
    }

    fn kind(&self) -> Option<AnchorKind> {
        if self.drops >= MAX_DROPS {
            return None;
        }
        match self.major {
            Some(sig) => Some(AnchorKind::Structural(sig)),
            None => self
                .cycle()
                .or_else(|| self.paced().then_some(AnchorKind::Paced)),
        }
    }

    /// Its last `RING` segments as a cycle of 2 or 3 balanced ones (see the module comment).
    fn cycle(&self) -> Option<AnchorKind> {
        if (self.n as usize) < RING {
            return None;
        }
        // Oldest first: the ring's next write goes where its oldest entry is.
        let at = |j: usize| (self.n as usize + j) % RING;
        let sig = |j: usize| self.sigs[at(j)];
        if (0..RING).any(|j| sig(j) == 0) {
            return None;
        }
        let len = (2..=3).find(|&k| (k..RING).all(|j| sig(j) == sig(j - k)))?;
        if (RING - len..RING).all(|j| sig(j) == sig(RING - 1)) {
            return None;
        }
        // No allocation: this runs at every allocation of a site without a majority.
        let balanced = |of: &dyn Fn(usize) -> f64| {
            let max = (0..RING).map(of).fold(0.0, f64::max);
            (0..RING).all(|j| of(j) >= CYCLE_BALANCE * max)
        };
        if !balanced(&|j| f64::from(self.counts[at(j)]))
            || !balanced(&|j| self.time_gaps[at(j)] as f64)
        {
            return None;
        }
        let mut sigs = [0u64; 3];
        for (i, slot) in sigs.iter_mut().take(len).enumerate() {
            *slot = sig(RING - len + i);
        }
        Some(AnchorKind::Cycle {
            sigs,
            len: len as u8,
        })
    }

    /// Mean gap in the process's allocations over the recent segments.
    fn period(&self) -> f64 {
        let g = self.filled(&self.gaps);
        g.iter().sum::<u64>() as f64 / g.len().max(1) as f64
    }

    /// The longest recent gap in its thread's allocations.
    fn max_local_gap(&self) -> u64 {
        if self.n == 0 {
            1
        } else {
            self.max_local
        }
    }

    /// Mean device live bytes at its recent allocations.
    fn mean_live(&self) -> f64 {
        let l = self.filled(&self.lives);
        l.iter().map(|&x| x as f64).sum::<f64>() / l.len().max(1) as f64
    }
}

#[derive(Clone, Copy, Debug)]
struct Anchor {
    key: (u32, SiteId),
    /// Where its candidate is: its thread's index in `EpochClock::threads`, its node there.
    thread: usize,
    at: usize,
    kind: AnchorKind,
    /// Mean gap in the process's allocations.
    period: f64,
    /// Paced: its pace, the EWMA of its time gaps (ns) that matched.
    pace: f64,
    misses: u32,
    /// Its last 16 segments, 1 where they matched what it locked on, and how many.
    agree: u16,
    agree_n: u8,
    last_idx: u64,
    last_local: u64,
    max_local_gap: u64,
}

impl Anchor {
    fn record(&mut self, matched: bool) {
        self.agree = (self.agree << 1) | u16::from(matched);
        self.agree_n = (self.agree_n + 1).min(16);
    }

    fn agreement(&self) -> f64 {
        let mask = if self.agree_n >= 16 {
            u16::MAX
        } else {
            (1u16 << self.agree_n) - 1
        };
        f64::from((self.agree & mask).count_ones()) / f64::from(self.agree_n.max(1))
    }
}

#[derive(Debug)]
pub struct EpochClock {
    pub source: EpochSource,
    /// The current epoch; allocations now are born in it.
    pub epoch: u32,
    allocs: u64,
    /// Threads followed, in the order first seen, and where each thread id is among them;
    /// `last_thread` is the previous allocation's (the next one is most often on it too).
    threads: Vec<Thread>,
    thread_of: FxHashMap<u32, usize>,
    last_thread: usize,
    anchor: Option<Anchor>,
    /// The epoch since which the current source has been stable: earlier epochs are warm-up.
    pub stable_since: u32,
    /// The current time window: its start, its length once known, and the lowest and highest
    /// live bytes seen in it.
    window_start: u64,
    window_len: Option<u64>,
    window_low: u64,
    window_high: u64,
    /// Recent gaps between allocations (ns), a ring (`gaps_n` written so far), for the
    /// window length: one store per allocation.
    alloc_gaps: [u64; WINDOW_GAPS],
    gaps_n: u64,
    last_ts: u64,
    /// (epoch, start timestamp) of recent epochs.
    starts: VecDeque<(u32, u64)>,
    durations: VecDeque<u64>,
    first_ts: u64,
}

impl Default for EpochClock {
    fn default() -> Self {
        EpochClock {
            source: EpochSource::None,
            epoch: 0,
            allocs: 0,
            threads: Vec::new(),
            thread_of: FxHashMap::default(),
            last_thread: 0,
            anchor: None,
            stable_since: 0,
            window_start: 0,
            window_len: None,
            window_low: u64::MAX,
            window_high: 0,
            alloc_gaps: [0; WINDOW_GAPS],
            gaps_n: 0,
            last_ts: 0,
            starts: VecDeque::new(),
            durations: VecDeque::new(),
            first_ts: 0,
        }
    }
}

impl EpochClock {
    /// A step marker: returns true (a boundary) always; markers take over from then on.
    pub fn on_marker(&mut self, ts: u64) -> bool {
        if self.source != EpochSource::Markers {
            self.stable_since = self.epoch + 1;
        }
        self.source = EpochSource::Markers;
        self.anchor = None;
        self.threads = Vec::new();
        self.thread_of = FxHashMap::default();
        self.last_thread = 0;
        self.advance(ts);
        true
    }

    /// An allocation at `site` on thread `tid`, with `device_live` bytes live on its device
    /// before it. Returns true if an epoch boundary falls just before it (the allocation is
    /// then born in the new epoch).
    pub fn on_alloc(&mut self, site: SiteId, tid: u32, ts: u64, device_live: u64) -> bool {
        if self.first_ts == 0 {
            self.first_ts = ts;
            self.window_start = ts;
        }
        self.allocs += 1;
        if self.source == EpochSource::Markers {
            return false;
        }
        let idx = self.allocs;
        if self.last_ts != 0 {
            self.alloc_gaps[(self.gaps_n % WINDOW_GAPS as u64) as usize] =
                ts.saturating_sub(self.last_ts);
            self.gaps_n += 1;
        }
        self.last_ts = ts;
        let mut boundary = self.follow(site, tid, idx, ts, device_live);
        if let Some(a) = &self.anchor {
            let local = self.threads[a.thread].idx;
            if local.saturating_sub(a.last_local)
                > ANCHOR_SILENT_GAPS.saturating_mul(a.max_local_gap.max(1))
                || idx.saturating_sub(a.last_idx) as f64 > ANCHOR_SILENT_PERIODS * a.period.max(1.0)
            {
                self.drop_anchor(ts);
            }
        }
        if self.anchor.is_none() && self.window_closes(ts, device_live) {
            if self.source != EpochSource::Windows {
                self.source = EpochSource::Windows;
                self.stable_since = self.epoch + 1;
            }
            boundary = true;
        }
        if boundary {
            self.advance(ts);
            self.window_start = ts;
            self.window_len = None;
            self.window_low = device_live;
            self.window_high = device_live;
        }
        boundary
    }

    /// Follows the (thread, site) candidate; returns whether the anchor allocated.
    fn follow(&mut self, site: SiteId, tid: u32, idx: u64, ts: u64, device_live: u64) -> bool {
        let ti = match self.threads.get(self.last_thread) {
            Some(t) if t.tid == tid => self.last_thread,
            _ => match self.thread_of.get(&tid) {
                Some(&i) => i,
                None if self.threads.len() >= MAX_THREADS => return false,
                None => {
                    self.thread_of.insert(tid, self.threads.len());
                    self.threads.push(Thread::new(tid));
                    self.threads.len() - 1
                }
            },
        };
        self.last_thread = ti;
        let thread = &mut self.threads[ti];
        let (at, observed) = thread.observe(site);
        let local = thread.idx;
        let Some(segment) = observed else {
            // A site the thread cannot follow gets no candidate: it could never qualify.
            if site.0 != 0 && at != NONE {
                thread.cands[at as usize] = Some(Candidate {
                    last_idx: idx,
                    last_local: local,
                    last_ts: ts,
                    ..Default::default()
                });
            }
            return false;
        };
        let key = (tid, site);
        let at = at as usize;
        let Some(c) = thread.cands[at].as_mut() else {
            return false;
        };
        let time_gap = ts.saturating_sub(c.last_ts);
        let sig = segment.0;
        c.push(
            segment,
            idx.saturating_sub(c.last_idx),
            time_gap,
            local.saturating_sub(c.last_local),
            device_live,
        );
        c.last_idx = idx;
        c.last_local = local;
        c.last_ts = ts;
        let kind = c.kind();
        let qualifies = kind.is_some();
        let newly = qualifies && !c.qualified;
        c.qualified = qualifies;
        let max_local_gap = c.max_local_gap();
        let period = c.period();
        // Updated in place: the anchor is read or written at every allocation.
        match &mut self.anchor {
            Some(a) if a.thread == ti && a.at == at => {
                a.last_idx = idx;
                a.last_local = local;
                a.max_local_gap = max_local_gap;
                let keep = match a.kind {
                    AnchorKind::Structural(locked) => {
                        let matched = sig == locked;
                        a.record(matched);
                        a.misses = if matched { 0 } else { a.misses + 1 };
                        a.misses < ANCHOR_MISSES
                    }
                    AnchorKind::Cycle { sigs, len } => {
                        let matched = sigs[..usize::from(len)].contains(&sig);
                        a.record(matched);
                        a.misses = if matched { 0 } else { a.misses + 1 };
                        a.misses < ANCHOR_MISSES
                    }
                    AnchorKind::Paced => {
                        let g = time_gap as f64;
                        let pace = a.pace;
                        a.record((g - pace).abs() <= PACED_TOLERANCE * pace);
                        let matched = g >= pace / 3.0 && g <= 3.0 * pace;
                        if matched {
                            a.pace += ANCHOR_EWMA * (g - pace);
                        }
                        a.misses = if matched { 0 } else { a.misses + 1 };
                        a.misses < ANCHOR_MISSES
                    }
                };
                if !keep {
                    self.drop_anchor(ts);
                }
                keep
            }
            None if qualifies => {
                self.lock(key);
                self.anchor.is_some_and(|a| a.key == key)
            }
            // A structural candidate that qualifies after a structural anchor locked (the
            // first iteration's layer loop qualified before the iteration did): the anchor
            // gives way if it no longer allocates near the trough. A paced anchor stays: a
            // sparse stream's occasional sites repeat a signature every few steps.
            Some(a)
                if newly && kind.is_some_and(AnchorKind::by_structure) && a.kind.by_structure() =>
            {
                let anchor = a.key;
                // The sanity rule: a cycle whose iterations make up the anchor's period (the
                // anchor is a site of one branch, allocating every `len`-th iteration) splits
                // it, where both allocate near the trough.
                let splits = match kind {
                    Some(AnchorKind::Cycle { len, .. }) => {
                        (a.period - f64::from(len) * period).abs() <= 0.1 * a.period
                    }
                    _ => false,
                };
                match self.select(key) {
                    Some((_, pool))
                        if !pool.contains(&anchor) || (splits && pool.contains(&key)) =>
                    {
                        self.lock_on(key);
                        self.anchor.is_some_and(|a| a.key == key)
                    }
                    _ => false,
                }
            }
            _ => false,
        }
    }

    /// Locks the best qualifying anchor, `trigger` being one that just qualified: structural
    /// before paced; among those, the ones that allocate near the trough (mean live bytes at
    /// their recent allocations within 1/8 of the candidates' range above the lowest: a site
    /// inside the forward pass's layer loop allocates while activations pile up, the
    /// iteration begins when they are gone), then the shortest period (within 10 %: not a
    /// site that allocates every third step), then the lowest live bytes.
    fn lock(&mut self, trigger: (u32, SiteId)) {
        if let Some(((key, _, _), _)) = self.select(trigger) {
            self.lock_on(key);
        }
    }

    /// Locks the candidate of `key` as the anchor, as it qualifies now.
    fn lock_on(&mut self, key: (u32, SiteId)) {
        let Some((thread, at)) = self.find(key) else {
            return;
        };
        let Some(c) = self.threads[thread].cands[at].as_ref() else {
            return;
        };
        let Some(kind) = c.kind() else {
            return;
        };
        let period = c.period();
        let pace = c.pace().0;
        self.anchor = Some(Anchor {
            key,
            thread,
            at,
            kind,
            period,
            pace,
            misses: 0,
            agree: (1 << ANCHOR_MIN_SEGMENTS) - 1,
            agree_n: ANCHOR_MIN_SEGMENTS as u8,
            last_idx: c.last_idx,
            last_local: c.last_local,
            max_local_gap: c.max_local_gap(),
        });
        self.source = EpochSource::Auto;
        self.stable_since = self.epoch + 1;
    }

    /// The best qualifying anchor (see [`EpochClock::lock`]), and the candidates that allocate
    /// near the trough.
    #[allow(clippy::type_complexity)]
    fn select(
        &self,
        trigger: (u32, SiteId),
    ) -> Option<(((u32, SiteId), AnchorKind, f64), Vec<(u32, SiteId)>)> {
        // In no particular order: every use below is a count, a minimum or a maximum, the
        // best broken by its key.
        let qualified: Vec<((u32, SiteId), AnchorKind, f64, f64)> = self
            .candidates()
            .filter_map(|(k, c)| c.kind().map(|kind| (k, kind, c.period(), c.mean_live())))
            .collect();
        let structural = qualified.iter().any(|q| q.1.by_structure());
        let pool: Vec<_> = qualified
            .into_iter()
            .filter(|q| q.1.by_structure() == structural)
            .collect();
        let low = pool.iter().map(|q| q.3).fold(f64::INFINITY, f64::min);
        let high = pool.iter().map(|q| q.3).fold(0.0, f64::max);
        let pool: Vec<_> = pool
            .into_iter()
            .filter(|q| q.3 <= low + (high - low) / 8.0)
            .collect();
        let shortest = pool.iter().map(|q| q.2).fold(f64::INFINITY, f64::min);
        let best = pool
            .iter()
            .filter(|q| q.2 <= 1.1 * shortest)
            .min_by(|a, b| a.3.total_cmp(&b.3).then(a.0.cmp(&b.0)))
            .copied();
        let (key, kind, period, _) = best.or_else(|| {
            let (t, at) = self.find(trigger)?;
            let c = self.threads[t].cands[at].as_ref()?;
            Some((trigger, c.kind()?, c.period(), c.mean_live()))
        })?;
        Some(((key, kind, period), pool.iter().map(|q| q.0).collect()))
    }

    /// Every candidate, with its (thread, site).
    fn candidates(&self) -> impl Iterator<Item = ((u32, SiteId), &Candidate)> + '_ {
        self.threads.iter().flat_map(|t| {
            t.nodes
                .iter()
                .zip(&t.cands)
                .filter_map(move |(n, c)| Some(((t.tid, n.site), c.as_ref()?)))
        })
    }

    /// Where the candidate of (thread, site) is: its thread's index and its node there.
    fn find(&self, (tid, site): (u32, SiteId)) -> Option<(usize, usize)> {
        let t = *self.thread_of.get(&tid)?;
        let at = *self.threads[t].slot.get(&site)?;
        Some((t, at as usize))
    }

    fn drop_anchor(&mut self, ts: u64) {
        if let Some(a) = self.anchor.take() {
            if let Some(c) = self.threads[a.thread].cands[a.at].as_mut() {
                c.drops = c.drops.saturating_add(1);
            }
        }
        self.source = EpochSource::Windows;
        self.window_start = ts;
        self.window_len = None;
        self.window_low = u64::MAX;
        self.window_high = 0;
        self.stable_since = self.epoch + 1;
    }

    /// Whether the time window closes before this allocation (see the module comment).
    fn window_closes(&mut self, ts: u64, device_live: u64) -> bool {
        self.window_low = self.window_low.min(device_live);
        self.window_high = self.window_high.max(device_live);
        let elapsed = ts.saturating_sub(self.window_start);
        if elapsed < WINDOW_MIN_NS {
            return false;
        }
        let len = *self.window_len.get_or_insert_with(|| {
            // The gaps kept, in no particular order: sorted for the median.
            let n = (self.gaps_n as usize).min(WINDOW_GAPS);
            let mut g: Vec<u64> = self.alloc_gaps[..n].to_vec();
            g.sort_unstable();
            let median = g.get(g.len() / 2).copied().unwrap_or(0);
            WINDOW_MIN_NS.max(median.saturating_mul(WINDOW_GAP_FACTOR))
        });
        if elapsed < len {
            return false;
        }
        let trough = self.window_low + (self.window_high - self.window_low) / 8;
        device_live <= trough || elapsed >= len.saturating_mul(2)
    }

    fn advance(&mut self, ts: u64) {
        let start = self.starts.back().map(|&(_, t)| t).unwrap_or(self.first_ts);
        if start != 0 && ts >= start {
            self.durations.push_back(ts - start);
            if self.durations.len() > DURATIONS_KEPT {
                self.durations.pop_front();
            }
        }
        self.epoch += 1;
        self.starts.push_back((self.epoch, ts));
        if self.starts.len() > STARTS_KEPT {
            self.starts.pop_front();
        }
    }

    /// When `epoch` began (ns), if still remembered; epoch 0 began with the first event.
    pub fn start_of(&self, epoch: u32) -> Option<u64> {
        if epoch == 0 {
            return (self.first_ts != 0).then_some(self.first_ts);
        }
        let front = self.starts.front()?.0;
        let i = epoch.checked_sub(front)? as usize;
        self.starts.get(i).map(|&(_, t)| t)
    }

    /// Median epoch duration in seconds over recent epochs.
    pub fn median_duration_s(&self) -> Option<f64> {
        if self.durations.is_empty() {
            return None;
        }
        let mut v: Vec<f64> = self.durations.iter().map(|&d| d as f64 / 1e9).collect();
        Some(super::stats::median(&mut v))
    }

    /// The duration of a step (seconds) to turn a per-step rate into a per-second one: the
    /// mean over the recent epochs, and only when they span at least [`RATE_MIN_SPAN_NS`] of
    /// the trace.
    pub fn step_duration_for_rates_s(&self) -> Option<f64> {
        let span: u64 = self.durations.iter().sum();
        (span >= RATE_MIN_SPAN_NS && !self.durations.is_empty())
            .then(|| span as f64 / 1e9 / self.durations.len() as f64)
    }

    /// The anchor's period in allocation events, when auto-detected.
    pub fn period_allocs(&self) -> Option<f64> {
        self.anchor.map(|a| a.period)
    }

    pub fn anchor(&self) -> Option<SiteId> {
        self.anchor.map(|a| a.key.1)
    }

    /// What made the current anchor qualify.
    pub fn anchor_kind(&self) -> Option<AnchorKind> {
        self.anchor.map(|a| a.kind)
    }

    /// How sure the clock is that its epochs are the program's steps, 0..1: 1 with markers;
    /// with an anchor, 0.9 (structural) or 0.7 (paced) times the share of its last 16
    /// allocations that matched what it locked on; 0.3 for time windows; 0 without epochs.
    pub fn confidence(&self) -> f64 {
        match (self.source, self.anchor) {
            (EpochSource::Markers, _) => 1.0,
            (EpochSource::Auto, Some(a)) => {
                let base = match a.kind {
                    AnchorKind::Structural(_) | AnchorKind::Cycle { .. } => STRUCTURAL_CONFIDENCE,
                    AnchorKind::Paced => PACED_CONFIDENCE,
                };
                base * a.agreement()
            }
            (EpochSource::Windows, _) if self.epoch > 0 => TIME_CONFIDENCE,
            _ => 0.0,
        }
    }
}

#[cfg(test)]
mod tests;
