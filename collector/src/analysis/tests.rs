use super::*;
use crate::model::OUT_OF_MEMORY;
use oomtrace_proto::wire::Hello;
use oomtrace_proto::{Event, EventKind};

fn ev(kind: EventKind, api: Api, ptr: u64, size: u64) -> Event {
    let mut e = Event::new(kind, api);
    e.ptr = ptr;
    e.size = size;
    e.device = 0;
    e
}

#[test]
fn oom_records_state_at_failure() {
    let mut p = Process::new(1, Hello::default());
    let mut a = Analysis::default();
    p.apply_event(&ev(EventKind::Alloc, Api::cuMemAlloc_v2, 0xa, 1000), &mut a);
    let mut f = ev(EventKind::AllocFailed, Api::cuMemAlloc_v2, 0, 5000);
    f.result = OUT_OF_MEMORY;
    f.tid = 9;
    p.apply_event(&f, &mut a);
    let mut info = ev(EventKind::MemInfo, Api::cuMemGetInfo_v2, 300, 4096);
    info.tid = 9;
    p.apply_event(&info, &mut a);
    let o = &a.oom.records[0];
    assert_eq!(
        (o.size, o.live_bytes, o.free_bytes, o.total_bytes),
        (5000, 1000, Some(300), Some(4096))
    );
    assert_eq!(o.top_sites, vec![(SiteId(0), 1000, 1)]);
}

#[test]
fn levels_keep_their_report_words() {
    let names: Vec<&str> = [
        Level::INFO,
        Severity::Warning.into(),
        Severity::Error.into(),
        Confidence::Suspected.into(),
        Confidence::Likely.into(),
        Confidence::Confirmed.into(),
    ]
    .iter()
    .map(|l: &Level| l.name())
    .collect();
    assert_eq!(
        names,
        [
            "info",
            "warning",
            "error",
            "suspected",
            "likely",
            "confirmed"
        ]
    );
}
