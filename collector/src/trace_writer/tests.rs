//! Unit tests of the collector's trace writer (`trace_writer.rs`).

use super::*;

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "oomtrace-writer-test-{}-{name}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn outputs_that_are_not_regular_files_are_refused() {
    let d = scratch("refuse");
    std::fs::write(d.join("file"), b"x").unwrap();
    std::os::unix::fs::symlink(d.join("file"), d.join("link")).unwrap();
    assert!(check_output(&d.join("file")).is_ok());
    assert!(check_output(&d.join("new")).is_ok());
    assert!(check_output(&d.join("link"))
        .unwrap_err()
        .contains("symbolic link"));
    assert!(check_output(&d).unwrap_err().contains("directory"));
    assert!(check_output(Path::new("/dev/null"))
        .unwrap_err()
        .contains("character device"));
    assert!(TraceFile::create(&d.join("link"), false, "test").is_err());
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn the_file_appears_at_the_first_connection_and_never_replaces_with_no_clobber() {
    let d = scratch("place");
    let dest = d.join("t.oomt");
    std::fs::write(&dest, b"someone's").unwrap();
    let (tx, rx) = crossbeam_channel::bounded(8);
    let shared = SharedFailure::default();
    let tf = TraceFile::create(&dest, true, "test").unwrap();
    let h = std::thread::spawn(move || write_loop(tf, rx, false, shared));
    tx.send(WriterMsg::Open(1)).unwrap();
    drop(tx);
    let written = h.join().unwrap();
    assert_eq!(written.path, Some(d.join("t.1.oomt")));
    assert_eq!(std::fs::read(&dest).unwrap(), b"someone's");
    let t = crate::model::trace::Trace::<()>::load(&d.join("t.1.oomt")).unwrap();
    assert!(t.complete);
    // Nobody connects: nothing is left, not even the temporary file.
    let (tx, rx) = crossbeam_channel::bounded(8);
    let tf = TraceFile::create(&d.join("u.oomt"), false, "test").unwrap();
    let h = std::thread::spawn(move || write_loop(tf, rx, false, Default::default()));
    drop(tx);
    assert_eq!(h.join().unwrap().path, None);
    let mut left: Vec<_> = std::fs::read_dir(&d)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    left.sort();
    assert_eq!(left, ["t.1.oomt", "t.oomt"]);
    let _ = std::fs::remove_dir_all(&d);
}

/// A writer thread for `tf` with one process connected, its Open already written (the
/// trace placed under its name).
fn writing_one_process(
    tf: TraceFile,
) -> (
    crossbeam_channel::Sender<WriterMsg>,
    std::thread::JoinHandle<Written>,
) {
    let (tx, rx) = crossbeam_channel::bounded(8);
    let h = std::thread::spawn(move || write_loop(tf, rx, false, Default::default()));
    tx.send(WriterMsg::Open(1)).unwrap();
    let (ack, acked) = crossbeam_channel::bounded(1);
    tx.send(WriterMsg::Sync(ack)).unwrap();
    acked.recv().unwrap();
    (tx, h)
}

#[test]
fn a_trace_whose_directory_vanishes_is_saved_whole_where_asked_and_never_over_a_file() {
    let d = scratch("vanish");
    let gone = d.join("gone");
    let keep = d.join("keep");
    std::fs::create_dir(&gone).unwrap();
    std::fs::create_dir(&keep).unwrap();
    // A file of that name is there already: the copy takes the next free name.
    std::fs::write(keep.join("t.oomt"), b"someone's").unwrap();
    let mut tf = TraceFile::create(&gone.join("t.oomt"), false, "test").unwrap();
    tf.save_vanished_in = Some(keep.clone());
    let (tx, h) = writing_one_process(tf);
    std::fs::remove_dir_all(&gone).unwrap();
    drop(tx);
    let written = h.join().unwrap();
    let saved = keep.join("t.1.oomt");
    assert_eq!(written.path, Some(saved.clone()));
    let v = written.vanished.expect("vanished");
    assert_eq!(
        v.line(),
        format!(
            "the trace {} is gone (its directory {} was removed during the run); saved it \
             to {} instead",
            gone.join("t.oomt").display(),
            gone.display(),
            saved.display()
        )
    );
    assert_eq!(std::fs::read(keep.join("t.oomt")).unwrap(), b"someone's");
    let t = crate::model::trace::Trace::<()>::load(&saved).unwrap();
    assert!(t.complete, "the whole trace, its end included");
    // Nowhere to save it (a standalone collector): said, and no path.
    std::fs::create_dir(&gone).unwrap();
    let tf = TraceFile::create(&gone.join("u.oomt"), false, "test").unwrap();
    let (tx, h) = writing_one_process(tf);
    std::fs::remove_dir_all(&gone).unwrap();
    drop(tx);
    let written = h.join().unwrap();
    assert_eq!(written.path, None);
    assert!(written
        .vanished
        .unwrap()
        .line()
        .ends_with("was removed during the run)"));
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_directory_removed_before_the_first_process_connects_still_keeps_its_trace() {
    for no_clobber in [false, true] {
        let d = scratch(if no_clobber { "early-nc" } else { "early" });
        let gone = d.join("gone");
        let keep = d.join("keep");
        std::fs::create_dir(&gone).unwrap();
        std::fs::create_dir(&keep).unwrap();
        let mut tf = TraceFile::create(&gone.join("t.oomt"), no_clobber, "test").unwrap();
        tf.save_vanished_in = Some(keep.clone());
        // Gone before anything was placed (the program ran ahead of its first Hello).
        std::fs::remove_dir_all(&gone).unwrap();
        let (tx, rx) = crossbeam_channel::bounded(8);
        let h = std::thread::spawn(move || write_loop(tf, rx, false, Default::default()));
        tx.send(WriterMsg::Open(1)).unwrap();
        drop(tx);
        let written = h.join().unwrap();
        assert!(written.failure.is_none(), "{:?}", written.failure);
        let saved = keep.join("t.oomt");
        assert_eq!(written.path, Some(saved.clone()));
        assert!(written.vanished.is_some());
        let t = crate::model::trace::Trace::<()>::load(&saved).unwrap();
        assert!(t.complete, "the whole trace, its end included");
        let _ = std::fs::remove_dir_all(&d);
    }
}

#[test]
fn the_default_mode_replaces_a_regular_file_only_when_a_process_connects() {
    let d = scratch("replace");
    let dest = d.join("t.oomt");
    std::fs::write(&dest, b"old").unwrap();
    let (tx, rx) = crossbeam_channel::bounded(8);
    let tf = TraceFile::create(&dest, false, "test").unwrap();
    // Created beside it, the old file untouched until then.
    assert_eq!(std::fs::read(&dest).unwrap(), b"old");
    let h = std::thread::spawn(move || write_loop(tf, rx, false, Default::default()));
    tx.send(WriterMsg::Open(1)).unwrap();
    drop(tx);
    let written = h.join().unwrap();
    assert_eq!(written.path, Some(dest.clone()));
    assert!(written.failure.is_none());
    assert!(
        crate::model::trace::Trace::<()>::load(&dest)
            .unwrap()
            .complete
    );
    assert_eq!(std::fs::read_dir(&d).unwrap().count(), 1);
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_failure_is_told_with_what_each_process_lost() {
    let f = Failure {
        cause: WriteFailure::DiskFull,
        error: "No space left on device".into(),
        path: PathBuf::from("/t/x.oomt"),
        t_unix_ns: 1,
    };
    let lost = Unwritten {
        records: 2,
        bytes: 100,
        events: 7,
    };
    assert_eq!(
        f.line_for(lost),
        "the trace /t/x.oomt is incomplete: disk full (No space left on device); 7 events \
         of this process were not written"
    );
    assert!(f
        .line_for(Unwritten::default())
        .ends_with("the end of this process was not recorded"));
}
