//! Unit tests of the view's model (`model.rs`).

use super::*;

fn key(n: u32) -> Key {
    (Memory::Device, Site::from_number(n))
}

fn snap(pairs: &[(u32, u64)]) -> HashMap<Key, u64> {
    pairs.iter().map(|&(s, b)| (key(s), b)).collect()
}

fn total(bytes: u64) -> Level {
    Level {
        total: bytes,
        ..Level::default()
    }
}

/// A million events give at most two points a bucket, and every bucket's maximum survives
/// (a one-event spike included) with the sites as they stood at that moment.
#[test]
fn downsampling_bounds_points_and_keeps_maxima() {
    let n = 1_000_000u64;
    let mut d = Downsampler::new(0, n - 1, 100);
    let mut live = HashMap::new();
    let mut spikes = Vec::new();
    for t in 0..n {
        let base = t % 1000;
        let mut total = base;
        let site = key(1 + (t % 3) as u32);
        if t % 77_777 == 5 {
            total = 10_000_000 + t;
            spikes.push(total);
            live.insert(key(9), total);
            d.touch(key(9));
        } else if live.remove(&key(9)).is_some() {
            d.touch(key(9));
        }
        live.insert(site, base);
        d.touch(site);
        d.push(t, super::tests::total(total), &live);
    }
    d.finish(&live);
    assert!(d.points.len() <= 200, "{} points", d.points.len());
    for spike in spikes {
        let p = d
            .points
            .iter()
            .find(|p| p.level.total == spike)
            .expect("a spike was lost");
        assert_eq!(p.sites[0], (key(9), spike));
    }
    assert!(d.points.windows(2).all(|w| w[0].t_ns <= w[1].t_ns));
    assert_eq!(d.points.last().unwrap().t_ns, n - 1);
}

#[test]
fn a_bucket_keeps_its_last_value_after_its_maximum() {
    let mut d = Downsampler::new(0, 99, 1);
    let live = snap(&[(1, 5)]);
    d.touch(key(1));
    d.push(10, total(50), &live);
    d.push(20, total(5), &live);
    d.finish(&live);
    assert_eq!(d.points.len(), 2);
    assert_eq!((d.points[0].t_ns, d.points[0].level.total), (10, 50));
    assert_eq!((d.points[1].t_ns, d.points[1].level.total), (20, 5));
}

#[test]
fn flame_merges_small_sites_and_keeps_totals() {
    let held = snap(&[(1, 1000), (2, 1)]);
    let mut path_of = |k: Key| vec!["main".to_string(), format!("leaf{}", k.1.number())];
    let f = flame(&held, &mut path_of);
    assert_eq!(f["v"], 1001);
    // Depth-first: the root, its children and theirs, each one level deeper. The small
    // site is merged (into "(other)", being below the share itself).
    assert_eq!(
        f["nodes"],
        json!([
            [0, "all", 1001],
            [1, "main", 1000],
            [2, "leaf1", 1000],
            [1, "(other)", 1]
        ])
    );
}

/// A backward-pass site is labelled by its name (its forward line, never the node's C++
/// frame) and sits in the Python flame graph under its forward line's Python frames; without
/// a name it stays under "(no Python frames)".
#[test]
fn backward_pass_sites_are_labelled_and_placed_by_their_forward_line() {
    let native = |function: &str| Frame {
        function: function.into(),
        module: "libtorch_cpu.so".into(),
        ..Default::default()
    };
    let frames = vec![
        native("at::_ops::mm::call(at::Tensor const&, at::Tensor const&)"),
        native("torch::autograd::generated::AddmmBackward0::apply(std::vector<at::Tensor>&&)"),
        native("torch::autograd::Engine::thread_main(std::shared_ptr<torch::autograd::GraphTask> const&)"),
    ];
    let module = Frame {
        function: "<module>".into(),
        file: "/home/u/train.py".into(),
        line: 25,
        module: "python".into(),
        python: true,
        ..Default::default()
    };
    let name = BackwardName {
        name: "backward of addmm at train.py:25".into(),
        path: vec![module],
        leaf: "backward of addmm".into(),
        what: "backward of addmm".into(),
        line: Some(("/home/u/train.py".into(), 25)),
    };
    let site = Site::from_number(3);
    let info = SiteInfo::new(&frames, site, Some(name));
    assert_eq!(info.label, "backward of addmm at train.py:25");
    assert_eq!(
        info.python_path,
        ["train.py:25 <module>", "backward of addmm"]
    );
    assert!(!info.has_python);
    let unnamed = SiteInfo::new(&frames, site, None);
    assert_eq!(
        unnamed.python_path,
        ["(no Python frames)", "libtorch_cpu.so AddmmBackward0.apply"]
    );
}
