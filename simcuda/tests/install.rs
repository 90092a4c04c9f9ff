//! The embedded libraries and `install`.

mod common;
use common::{run_in, temp_dir};
use std::path::Path;

#[test]
fn constants_point_at_the_build() {
    for f in [
        "libcuda.so.1",
        "libcuda.so",
        "libcudart.so.12",
        "libcudart.so",
    ] {
        assert!(Path::new(simcuda::LIB_DIR).join(f).exists(), "{f}");
    }
    for f in ["cuda.h", "cuda_runtime.h"] {
        assert!(Path::new(simcuda::INCLUDE_DIR).join(f).exists(), "{f}");
    }
    assert_eq!(&simcuda::LIBCUDA[..4], b"\x7fELF");
    assert_eq!(&simcuda::LIBCUDART[..4], b"\x7fELF");
    // The soname is what the dynamic linker matches; it sits in .dynstr.
    let has = |hay: &[u8], needle: &[u8]| hay.windows(needle.len()).any(|w| w == needle);
    assert!(has(simcuda::LIBCUDA, b"libcuda.so.1\0"));
    assert!(has(simcuda::LIBCUDART, b"libcudart.so.12\0"));
}

#[test]
fn installed_libraries_work() {
    let dir = temp_dir("install");
    simcuda::install(&dir).unwrap();
    simcuda::install(&dir).unwrap(); // idempotent, replaces in place
    assert_eq!(
        std::fs::read_link(dir.join("libcuda.so")).unwrap(),
        Path::new("libcuda.so.1")
    );
    assert_eq!(
        std::fs::read_link(dir.join("libcudart.so")).unwrap(),
        Path::new("libcudart.so.12")
    );
    assert_eq!(
        std::fs::read(dir.join("libnvidia-ml.so.1")).unwrap(),
        simcuda::LIBNVML
    );
    assert_eq!(
        std::fs::read(dir.join("libcuda.so.1")).unwrap(),
        simcuda::LIBCUDA
    );
    let lib = dir.to_str().unwrap();
    let r = run_in(lib, "drvtest", &["init"], &[]);
    assert_eq!(r.code, Some(0), "{}{}", r.stdout, r.stderr);
    let r = run_in(lib, "rttest", &["basic"], &[]);
    assert_eq!(r.code, Some(0), "{}{}", r.stdout, r.stderr);
}
