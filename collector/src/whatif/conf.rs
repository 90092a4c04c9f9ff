//! PyTorch's allocator setting (`PYTORCH_ALLOC_CONF` / `PYTORCH_CUDA_ALLOC_CONF`) as a typed
//! [`AllocConf`], read the way torch 2.15 reads it.
//!
//! The string is a comma-separated list of `key:value`; a list value is in brackets
//! (`roundup_power2_divisions:[256:1,512:2,>:4]`). Whitespace is dropped anywhere, a later key
//! overrides an earlier one, and (since torch 2.9) a key torch does not know is an error, as it
//! is here: a typo must not silently predict the default.
//!
//! Which variable wins: torch 2.15 reads its device-generic settings
//! (`c10::CachingAllocator::AcceleratorAllocatorConfig`: `max_split_size_mb`,
//! `expandable_segments`, `roundup_power2_divisions`, `garbage_collection_threshold`, ...)
//! from `PYTORCH_ALLOC_CONF` when it is set and only otherwise from the deprecated
//! `PYTORCH_CUDA_ALLOC_CONF`, but its CUDA-only settings (`CUDAAllocatorConfig`: `backend`,
//! `per_process_memory_fraction`, ...) from `PYTORCH_CUDA_ALLOC_CONF` first. [`AllocConf::
//! from_env`] does the same with both strings.
//!
//! Keys that cannot change the reserve of the device caching allocator (the pinned host
//! allocator's, `release_lock_on_cudamalloc`, the expandable segments' address-space reserve
//! and handle type, CUDA graphs' `graph_capture_record_stream_reuse`) are accepted and kept in
//! [`AllocConf::ignored`]; `backend:cudaMallocAsync` parses (it is a real setting) but names an
//! allocator this model is not ([`Backend`]); `throw_on_cudamalloc_oom` is kept and said to be
//! unmodelled by the replay.

use std::fmt;

/// One MiB: the unit of every `_mb` setting.
pub const MIB: u64 = 1 << 20;
/// torch's default large-pool segment size for requests of 1 to 10 MiB (`kLargeBuffer`), and
/// the smallest `max_split_size_mb` it accepts.
pub const DEFAULT_LARGE_SEGMENT: u64 = 20 * MIB;
/// `roundup_power2_divisions` has one entry per power-of-two interval from 1 MiB to 64 GiB.
pub const ROUNDUP_INTERVALS: usize = 16;

/// Which allocator serves `torch.cuda` memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// PyTorch's own caching allocator: what this model replays.
    Native,
    /// CUDA's stream-ordered allocator (`cudaMallocAsync`): its pools live in the driver and
    /// are not modelled.
    CudaMallocAsync,
}

/// The settings of the caching allocator, with torch 2.15's defaults.
#[derive(Clone, Debug, PartialEq)]
pub struct AllocConf {
    /// The string it was read from (both, when two variables were combined), as given.
    pub source: String,
    pub backend: Backend,
    /// Blocks of at least this size are never split (`max_split_size_mb`); `u64::MAX` when
    /// unset.
    pub max_split_size: u64,
    /// How far above the request an oversize cached block may be and still serve it
    /// (`max_non_split_rounding_mb`; defaults to the large segment size).
    pub max_non_split_rounding: u64,
    /// The segment size for requests of 1 to 10 MiB, and the page of an expandable large-pool
    /// segment (`large_segment_size_mb`).
    pub large_segment_size: u64,
    /// Divisions per power-of-two interval (index 0: up to 2 MiB, then one per doubling, the
    /// last for 32 GiB and above); 0 or 1 round to 512 bytes only.
    pub roundup_power2_divisions: [u64; ROUNDUP_INTERVALS],
    /// Reclaim cached blocks once the reserve passes this fraction of the allowed memory
    /// (`garbage_collection_threshold`, 0 = off). torch applies it only when a memory
    /// fraction is set.
    pub garbage_collection_threshold: f64,
    pub expandable_segments: bool,
    /// `per_process_memory_fraction`: the allocator refuses to reserve more than this
    /// fraction of the device (torch's `set_per_process_memory_fraction`, set by the setting).
    pub per_process_memory_fraction: Option<f64>,
    /// `throw_on_cudamalloc_oom:True`, which the replay does not model (it still frees the
    /// cache and retries before an OOM).
    pub throw_on_cudamalloc_oom: bool,
    /// Keys that were accepted but change nothing the model predicts.
    pub ignored: Vec<String>,
}

impl Default for AllocConf {
    fn default() -> AllocConf {
        AllocConf {
            source: String::new(),
            backend: Backend::Native,
            max_split_size: u64::MAX,
            max_non_split_rounding: DEFAULT_LARGE_SEGMENT,
            large_segment_size: DEFAULT_LARGE_SEGMENT,
            roundup_power2_divisions: [0; ROUNDUP_INTERVALS],
            garbage_collection_threshold: 0.0,
            expandable_segments: false,
            per_process_memory_fraction: None,
            throw_on_cudamalloc_oom: false,
            ignored: Vec::new(),
        }
    }
}

/// Why a setting string was refused: one sentence naming the key and what is wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfError(pub String);

impl fmt::Display for ConfError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConfError {}

/// Which of the two variables a key is read from when both are set.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Scope {
    /// `AcceleratorAllocatorConfig`: `PYTORCH_ALLOC_CONF` wins.
    Generic,
    /// `CUDAAllocatorConfig`: `PYTORCH_CUDA_ALLOC_CONF` wins.
    Cuda,
}

/// Every key torch 2.15 knows, with the variable it is read from first.
const KEYS: &[(&str, Scope)] = &[
    ("large_segment_size_mb", Scope::Generic),
    ("max_split_size_mb", Scope::Generic),
    ("max_non_split_rounding_mb", Scope::Generic),
    ("garbage_collection_threshold", Scope::Generic),
    ("roundup_power2_divisions", Scope::Generic),
    ("expandable_segments", Scope::Generic),
    ("pinned_use_background_threads", Scope::Generic),
    ("pinned_max_round_threshold_mb", Scope::Generic),
    ("pinned_max_cached_size_mb", Scope::Generic),
    ("backend", Scope::Cuda),
    ("release_lock_on_cudamalloc", Scope::Cuda),
    ("release_lock_on_hipmalloc", Scope::Cuda),
    ("pinned_use_cuda_host_register", Scope::Cuda),
    ("pinned_use_hip_host_register", Scope::Cuda),
    ("pinned_num_register_threads", Scope::Cuda),
    ("pinned_reserve_segment_size_mb", Scope::Cuda),
    ("pinned_free_catch_all", Scope::Cuda),
    ("graph_capture_record_stream_reuse", Scope::Cuda),
    ("per_process_memory_fraction", Scope::Cuda),
    ("throw_on_cudamalloc_oom", Scope::Cuda),
    ("expandable_segments_reserve", Scope::Cuda),
    ("expandable_segments_reserve_by_class", Scope::Cuda),
    ("expandable_segments_handle_type", Scope::Cuda),
];

/// One `key:value` of the string; `value` holds the bracketed list's items for a list.
#[derive(Debug)]
struct Entry {
    key: String,
    value: Value,
}

#[derive(Debug)]
enum Value {
    One(String),
    /// `[a:b,c:d]` as (a, b) pairs; a bare item (`[a,b]`) has an empty second half.
    List(Vec<(String, String)>),
}

/// Splits `s` the way torch's `ConfigTokenizer` does: `,` `:` `[` `]` are tokens of their
/// own, whitespace is dropped.
fn tokens(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut buf = String::new();
    for ch in s.chars() {
        if matches!(ch, ',' | ':' | '[' | ']') {
            if !buf.is_empty() {
                out.push(std::mem::take(&mut buf));
            }
            out.push(ch.to_string());
        } else if !ch.is_whitespace() {
            buf.push(ch);
        }
    }
    if !buf.is_empty() {
        out.push(buf);
    }
    out
}

fn entries(s: &str) -> Result<Vec<Entry>, ConfError> {
    let t = tokens(s);
    let mut out = Vec::new();
    let mut i = 0;
    let tok = |i: usize| t.get(i).map(String::as_str);
    while i < t.len() {
        let key = t[i].clone();
        if matches!(key.as_str(), "," | ":" | "[" | "]") {
            return Err(ConfError(format!(
                "allocator setting {s:?}: expected a key at '{key}'"
            )));
        }
        if tok(i + 1) != Some(":") {
            return Err(ConfError(format!(
                "allocator setting {key}: expected ':' and a value after it"
            )));
        }
        i += 2;
        let value = match tok(i) {
            None | Some(",") | Some(":") | Some("]") => {
                return Err(ConfError(format!("allocator setting {key}: no value")))
            }
            Some("[") => {
                let mut items = Vec::new();
                i += 1;
                loop {
                    match tok(i) {
                        None => {
                            return Err(ConfError(format!(
                                "allocator setting {key}: the list has no closing ']'"
                            )))
                        }
                        Some("]") => break,
                        Some(",") => i += 1,
                        Some(a) => {
                            let a = a.to_string();
                            if tok(i + 1) == Some(":") {
                                match tok(i + 2) {
                                    Some(b) if !matches!(b, "," | ":" | "[" | "]") => {
                                        items.push((a, b.to_string()));
                                        i += 3;
                                    }
                                    _ => {
                                        return Err(ConfError(format!(
                                        "allocator setting {key}: '{a}:' has no value in the list"
                                    )))
                                    }
                                }
                            } else {
                                items.push((a, String::new()));
                                i += 1;
                            }
                        }
                    }
                }
                Value::List(items)
            }
            Some(v) => Value::One(v.to_string()),
        };
        i += 1;
        match tok(i) {
            None => {}
            Some(",") => i += 1,
            Some(other) => {
                return Err(ConfError(format!(
                    "allocator setting {key}: expected ',' before '{other}'"
                )))
            }
        }
        out.push(Entry { key, value });
    }
    Ok(out)
}

fn one(e: &Entry) -> Result<&str, ConfError> {
    match &e.value {
        Value::One(v) => Ok(v),
        Value::List(_) => Err(ConfError(format!(
            "allocator setting {}: expected one value, not a list",
            e.key
        ))),
    }
}

fn int(key: &str, v: &str) -> Result<u64, ConfError> {
    v.parse::<u64>().map_err(|_| {
        ConfError(format!(
            "allocator setting {key}: '{v}' is not a whole number"
        ))
    })
}

fn float(key: &str, v: &str) -> Result<f64, ConfError> {
    v.parse::<f64>()
        .ok()
        .filter(|x| x.is_finite())
        .ok_or_else(|| ConfError(format!("allocator setting {key}: '{v}' is not a number")))
}

fn boolean(key: &str, v: &str) -> Result<bool, ConfError> {
    match v {
        "True" => Ok(true),
        "False" => Ok(false),
        _ => Err(ConfError(format!(
            "allocator setting {key}: expected True or False, got '{v}'"
        ))),
    }
}

/// `n` MiB in bytes, saturating (torch clamps to the largest size too).
fn mib(n: u64) -> u64 {
    n.saturating_mul(MIB)
}

impl AllocConf {
    /// Reads one setting string (what `PYTORCH_CUDA_ALLOC_CONF` or `PYTORCH_ALLOC_CONF`
    /// holds). The empty string is torch's defaults.
    pub fn parse(s: &str) -> Result<AllocConf, ConfError> {
        let mut conf = AllocConf {
            source: s.to_string(),
            ..AllocConf::default()
        };
        conf.apply(&entries(s)?, |_| true)?;
        Ok(conf)
    }

    /// This setting with `overrides` (a setting string) on top, as if appended to it: what a
    /// user gets by adding one option to the setting they run with.
    pub fn with(&self, overrides: &str) -> Result<AllocConf, ConfError> {
        let mut conf = self.clone();
        conf.apply(&entries(overrides)?, |_| true)?;
        conf.source = if self.source.trim().is_empty() {
            overrides.to_string()
        } else {
            format!("{},{overrides}", self.source)
        };
        Ok(conf)
    }

    /// The setting a process ran with, from its two variables as torch 2.15 reads them (see
    /// the module comment): generic keys from `PYTORCH_ALLOC_CONF` when it is set, CUDA keys
    /// from `PYTORCH_CUDA_ALLOC_CONF` when it is set. Each string must parse on its own.
    pub fn from_env(cuda: Option<&str>, generic: Option<&str>) -> Result<AllocConf, ConfError> {
        let (generic_from, cuda_from) = (generic.or(cuda), cuda.or(generic));
        let mut conf = AllocConf {
            source: match (cuda, generic) {
                (Some(c), Some(g)) if c != g => {
                    format!("PYTORCH_ALLOC_CONF={g} PYTORCH_CUDA_ALLOC_CONF={c}")
                }
                _ => generic_from.unwrap_or("").to_string(),
            },
            ..AllocConf::default()
        };
        let scope_of = |k: &str| KEYS.iter().find(|(n, _)| *n == k).map(|&(_, s)| s);
        // Both strings are checked whole, as torch parses both.
        let g = entries(generic_from.unwrap_or(""))?;
        let c = entries(cuda_from.unwrap_or(""))?;
        conf.apply(&g, |k| scope_of(k) != Some(Scope::Cuda))?;
        conf.apply(&c, |k| scope_of(k) == Some(Scope::Cuda))?;
        Ok(conf)
    }

    /// Applies the entries whose key `take` accepts (every key is still checked to exist).
    fn apply(&mut self, entries: &[Entry], take: impl Fn(&str) -> bool) -> Result<(), ConfError> {
        // torch reads large_segment_size_mb first: the default rounding limit follows it.
        for e in entries.iter().filter(|e| e.key == "large_segment_size_mb") {
            if !take(&e.key) {
                continue;
            }
            let n = int(&e.key, one(e)?)?;
            if n <= 2 {
                return Err(ConfError(format!(
                    "allocator setting large_segment_size_mb: must be more than 2 (the small \
                     pool's 2 MiB segments), got {n}"
                )));
            }
            self.large_segment_size = mib(n);
            self.max_non_split_rounding = self.large_segment_size;
        }
        for e in entries {
            let key = e.key.as_str();
            if !KEYS.iter().any(|(k, _)| *k == key) {
                return Err(ConfError(match closest_key(key) {
                    Some(k) => format!(
                        "unknown allocator setting '{key}': did you mean '{k}'? (docs/whatif.md lists \
                         torch 2.15's keys)"
                    ),
                    None => format!(
                        "unknown allocator setting '{key}' (torch 2.15 knows: {})",
                        KEYS.iter().map(|(k, _)| *k).collect::<Vec<_>>().join(", ")
                    ),
                }));
            }
            if !take(key) {
                continue;
            }
            match key {
                "large_segment_size_mb" => {}
                "max_split_size_mb" => {
                    let n = int(key, one(e)?)?;
                    let min = self.large_segment_size / MIB;
                    if n < min {
                        return Err(ConfError(format!(
                            "allocator setting max_split_size_mb: too small, must be at least \
                             {min}, got {n}"
                        )));
                    }
                    self.max_split_size = mib(n);
                }
                "max_non_split_rounding_mb" => {
                    let n = int(key, one(e)?)?;
                    let min = self.large_segment_size / MIB;
                    if n < min {
                        return Err(ConfError(format!(
                            "allocator setting max_non_split_rounding_mb: too small, must be at \
                             least {min}, got {n}"
                        )));
                    }
                    self.max_non_split_rounding = mib(n);
                }
                "garbage_collection_threshold" => {
                    let x = float(key, one(e)?)?;
                    if !(x > 0.0 && x < 1.0) {
                        return Err(ConfError(format!(
                            "allocator setting garbage_collection_threshold: must be between 0 \
                             and 1 (both excluded), got {x}"
                        )));
                    }
                    self.garbage_collection_threshold = x;
                }
                "roundup_power2_divisions" => {
                    self.roundup_power2_divisions = divisions(e)?;
                }
                "expandable_segments" => self.expandable_segments = boolean(key, one(e)?)?,
                "backend" => {
                    self.backend = match one(e)? {
                        "native" => Backend::Native,
                        "cudaMallocAsync" => Backend::CudaMallocAsync,
                        other => {
                            return Err(ConfError(format!(
                                "allocator setting backend: '{other}' is not an allocator \
                                 (native or cudaMallocAsync)"
                            )))
                        }
                    }
                }
                "per_process_memory_fraction" => {
                    let x = float(key, one(e)?)?;
                    if !(0.0..=1.0).contains(&x) {
                        return Err(ConfError(format!(
                            "allocator setting per_process_memory_fraction: must be between 0 \
                             and 1, got {x}"
                        )));
                    }
                    self.per_process_memory_fraction = Some(x);
                }
                "throw_on_cudamalloc_oom" => {
                    self.throw_on_cudamalloc_oom = boolean(key, one(e)?)?;
                }
                "release_lock_on_cudamalloc"
                | "release_lock_on_hipmalloc"
                | "pinned_use_background_threads"
                | "pinned_use_cuda_host_register"
                | "pinned_use_hip_host_register"
                | "pinned_free_catch_all"
                | "graph_capture_record_stream_reuse" => {
                    boolean(key, one(e)?)?;
                    self.ignored.push(key.to_string());
                }
                "pinned_max_round_threshold_mb"
                | "pinned_max_cached_size_mb"
                | "pinned_num_register_threads"
                | "pinned_reserve_segment_size_mb" => {
                    int(key, one(e)?)?;
                    self.ignored.push(key.to_string());
                }
                // Address space and handle kinds of expandable segments: no bytes of memory.
                _ => self.ignored.push(key.to_string()),
            }
        }
        if self.max_non_split_rounding < self.large_segment_size {
            return Err(ConfError(format!(
                "allocator setting max_non_split_rounding_mb: must be at least \
                 large_segment_size_mb ({})",
                self.large_segment_size / MIB
            )));
        }
        Ok(())
    }

    /// The divisions for a request of `size` bytes: its power-of-two interval's entry
    /// (intervals from 1 MiB; smaller sizes use the first, 32 GiB and up the last).
    pub fn divisions_for(&self, size: u64) -> u64 {
        let log = 63 - u64::from(size.max(1).leading_zeros());
        let index = (log.saturating_sub(20) as usize).min(ROUNDUP_INTERVALS - 1);
        self.roundup_power2_divisions[index]
    }

    /// The setting in words for a reader: the string, or "PyTorch's defaults".
    pub fn describe(&self) -> String {
        if self.source.trim().is_empty() {
            "PyTorch's defaults".to_string()
        } else {
            self.source.clone()
        }
    }
}

/// `roundup_power2_divisions`: one number for every interval, or a list of
/// `interval_mb:divisions` (intervals powers of two, in MiB) and `>:divisions` for all
/// intervals above the last one named. A number before the first named interval fills the
/// intervals below it too.
fn divisions(e: &Entry) -> Result<[u64; ROUNDUP_INTERVALS], ConfError> {
    let key = "roundup_power2_divisions";
    let mut d = [0u64; ROUNDUP_INTERVALS];
    match &e.value {
        Value::One(v) => {
            let n = int(key, v)?;
            if !n.is_power_of_two() {
                return Err(ConfError(format!(
                    "allocator setting {key}: the divisions must be a power of 2, got {n}"
                )));
            }
            d = [n; ROUNDUP_INTERVALS];
        }
        Value::List(items) => {
            let mut first = true;
            let mut last = 0usize;
            for (interval, value) in items {
                if value.is_empty() {
                    return Err(ConfError(format!(
                        "allocator setting {key}: '{interval}' needs ':divisions'"
                    )));
                }
                let n = int(key, value)?;
                if n != 0 && !n.is_power_of_two() {
                    return Err(ConfError(format!(
                        "allocator setting {key}: the divisions must be a power of 2 or 0, got {n}"
                    )));
                }
                if interval == ">" {
                    for x in d.iter_mut().skip(last + 1) {
                        *x = n;
                    }
                    continue;
                }
                let mb = int(key, interval)?;
                if !mb.is_power_of_two() {
                    return Err(ConfError(format!(
                        "allocator setting {key}: the intervals must be powers of 2 (MiB), got {mb}"
                    )));
                }
                let index = (63 - mb.leading_zeros() as usize).min(ROUNDUP_INTERVALS - 1);
                if first {
                    for x in d.iter_mut().take(index) {
                        *x = n;
                    }
                    first = false;
                }
                d[index] = n;
                last = index;
            }
        }
    }
    Ok(d)
}

/// The known key a mistyped one most likely meant: the nearest by edit distance, when it is
/// near enough to be a typo (at most a third of the key's length, and 3) and nearer than any
/// other known key.
fn closest_key(typed: &str) -> Option<&'static str> {
    let typed = typed.to_ascii_lowercase();
    let mut scored: Vec<(usize, &'static str)> = KEYS
        .iter()
        .map(|(k, _)| (edit_distance(&typed, k), *k))
        .collect();
    scored.sort();
    let (best, key) = *scored.first()?;
    let unique = scored.get(1).is_none_or(|(second, _)| *second > best);
    (best <= (key.len() / 3).min(3) && unique).then_some(key)
}

/// Levenshtein distance between two short ASCII strings.
fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, &ca) in a.iter().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, &cb) in b.iter().enumerate() {
            cur[j + 1] = (prev[j] + usize::from(ca != cb))
                .min(prev[j + 1] + 1)
                .min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_is_the_defaults() {
        let c = AllocConf::parse("").unwrap();
        assert_eq!(c.max_split_size, u64::MAX);
        assert!(!c.expandable_segments);
        assert_eq!(c.large_segment_size, 20 * MIB);
        assert_eq!(c.max_non_split_rounding, 20 * MIB);
        assert_eq!(c.describe(), "PyTorch's defaults");
    }

    #[test]
    fn reads_the_common_keys() {
        let c = AllocConf::parse(
            " expandable_segments:True, max_split_size_mb:64,garbage_collection_threshold:0.6,\
             roundup_power2_divisions:4",
        )
        .unwrap();
        assert!(c.expandable_segments);
        assert_eq!(c.max_split_size, 64 * MIB);
        assert_eq!(c.garbage_collection_threshold, 0.6);
        assert_eq!(c.roundup_power2_divisions, [4; 16]);
        // A later key overrides an earlier one.
        let c = AllocConf::parse("expandable_segments:True,expandable_segments:False").unwrap();
        assert!(!c.expandable_segments);
    }

    #[test]
    fn reads_the_bracketed_divisions() {
        let c = AllocConf::parse("roundup_power2_divisions:[256:1,512:2,1024:4,>:8]").unwrap();
        // Intervals below 256 MiB (index 8) take the first number, then each named one, and
        // everything above 1024 MiB (index 10) the '>' one.
        let mut want = [1u64; 16];
        want[9] = 2;
        want[10] = 4;
        for w in want.iter_mut().skip(11) {
            *w = 8;
        }
        assert_eq!(c.roundup_power2_divisions, want);
        assert_eq!(c.divisions_for(300 * MIB), 1);
        assert_eq!(c.divisions_for(600 * MIB), 2);
        assert_eq!(c.divisions_for(5 << 30), 8);
        assert_eq!(c.divisions_for(1000), 1);
    }

    #[test]
    fn large_segment_size_moves_the_rounding_limit_and_the_split_minimum() {
        let c = AllocConf::parse("large_segment_size_mb:64").unwrap();
        assert_eq!(
            (c.large_segment_size, c.max_non_split_rounding),
            (64 * MIB, 64 * MIB)
        );
        let e = AllocConf::parse("max_split_size_mb:40,large_segment_size_mb:64").unwrap_err();
        assert!(
            e.0.contains("max_split_size_mb") && e.0.contains("64"),
            "{e}"
        );
    }

    #[test]
    fn settings_that_do_not_change_the_reserve_are_kept_aside() {
        let c = AllocConf::parse(
            "pinned_use_cuda_host_register:True,pinned_num_register_threads:8,\
             release_lock_on_cudamalloc:True",
        )
        .unwrap();
        assert_eq!(c.ignored.len(), 3);
        let c = AllocConf::parse("backend:cudaMallocAsync").unwrap();
        assert_eq!(c.backend, Backend::CudaMallocAsync);
    }

    #[test]
    fn refuses_what_torch_refuses_naming_the_key() {
        for (s, word) in [
            ("expandable_segment:True", "expandable_segment"),
            ("max_split_size_mb:10", "max_split_size_mb"),
            ("max_split_size_mb:lots", "max_split_size_mb"),
            ("expandable_segments:true", "expandable_segments"),
            (
                "garbage_collection_threshold:1.5",
                "garbage_collection_threshold",
            ),
            ("roundup_power2_divisions:3", "roundup_power2_divisions"),
            (
                "roundup_power2_divisions:[256:3]",
                "roundup_power2_divisions",
            ),
            (
                "roundup_power2_divisions:[300:2]",
                "roundup_power2_divisions",
            ),
            (
                "roundup_power2_divisions:[256:2",
                "roundup_power2_divisions",
            ),
            ("backend:magic", "backend"),
            ("max_split_size_mb", "max_split_size_mb"),
            ("max_split_size_mb:", "max_split_size_mb"),
            (
                "per_process_memory_fraction:2",
                "per_process_memory_fraction",
            ),
        ] {
            let e = AllocConf::parse(s).expect_err(s);
            assert!(e.0.contains(word), "{s}: {e}");
            assert!(!e.0.contains('\n'), "one line: {e}");
        }
    }

    #[test]
    fn generic_keys_prefer_pytorch_alloc_conf_and_cuda_keys_the_cuda_variable() {
        let c = AllocConf::from_env(
            Some("expandable_segments:True,per_process_memory_fraction:0.5"),
            Some("max_split_size_mb:64,per_process_memory_fraction:0.25"),
        )
        .unwrap();
        // expandable_segments came only from the CUDA variable, which loses for generic keys.
        assert!(!c.expandable_segments);
        assert_eq!(c.max_split_size, 64 * MIB);
        assert_eq!(c.per_process_memory_fraction, Some(0.5));
        let c = AllocConf::from_env(Some("expandable_segments:True"), None).unwrap();
        assert!(c.expandable_segments);
        assert_eq!(c.source, "expandable_segments:True");
        let c = AllocConf::from_env(None, Some("max_split_size_mb:64")).unwrap();
        assert_eq!(c.max_split_size, 64 * MIB);
    }

    #[test]
    fn a_mistyped_key_gets_did_you_mean() {
        for (typed, meant) in [
            ("expandable_segment", "expandable_segments"),
            ("max_split_size", "max_split_size_mb"),
            (
                "garbage_collection_treshold",
                "garbage_collection_threshold",
            ),
            ("Expandable_Segments", "expandable_segments"),
        ] {
            let e = AllocConf::parse(&format!("{typed}:True")).unwrap_err();
            assert!(
                e.0.contains(&format!("did you mean '{meant}'?")),
                "{typed}: {}",
                e.0
            );
        }
        // Nothing near: the list of keys.
        let e = AllocConf::parse("colour:red").unwrap_err();
        assert!(e.0.contains("torch 2.15 knows:"), "{}", e.0);
    }
}
