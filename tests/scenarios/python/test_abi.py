"""Tests of oomtrace._abi.trace_entry_layout (run by tests/it/python.rs:
`PYTHONPATH=python python3 tests/scenarios/python/test_abi.py`).

Releases' own headers (copies in torch-headers/<version>/, from the PyPI wheels: the two
layouts' oldest and newest tested releases, and 2.8.0) must be recognised with the right
layout; mutated copies must be rejected with a reason naming what differed; comments and
whitespace must not matter. Every release from 2.4 to 2.15 was checked the same way against
its wheel's full headers when the table in docs/pytorch-releases.md was made; the real-PyTorch tier checks
the installed release's headers (tests/it/torch/every_version.rs).
"""

import os
import shutil
import tempfile

from oomtrace._abi import LAYOUTS, trace_entry_layout

HERE = os.path.dirname(os.path.abspath(__file__))

EXPECTED = {
    "2.4.1": "v1",
    "2.8.0": "v1",
    "2.15.0": "v2",
}

FILES = (
    "c10/cuda/CUDACachingAllocator.h",
    "c10/core/CachingDeviceAllocator.h",
    "c10/core/Device.h",
)


def include(version):
    return os.path.join(HERE, "torch-headers", version)


def test_every_release_is_recognised():
    for version, want in EXPECTED.items():
        name, why = trace_entry_layout(include(version))
        assert name == want, (version, name, why)
        assert LAYOUTS[name]["namespace"] in why, why




class Mutated:
    """A copy of one release's three headers, with `rel`'s text edited by `edit`."""

    def __init__(self, version, rel, edit):
        self.dir = tempfile.mkdtemp(prefix="layout-")
        for f in FILES:
            os.makedirs(os.path.dirname(os.path.join(self.dir, f)), exist_ok=True)
            shutil.copy(os.path.join(include(version), f), os.path.join(self.dir, f))
        path = os.path.join(self.dir, rel)
        with open(path) as f:
            text = f.read()
        new = edit(text)
        assert new != text, "the edit changed nothing"
        with open(path, "w") as f:
            f.write(new)

    def __enter__(self):
        return trace_entry_layout(self.dir)

    def __exit__(self, *exc):
        shutil.rmtree(self.dir)


V1 = ("2.8.0", "c10/cuda/CUDACachingAllocator.h")
V2 = ("2.15.0", "c10/core/CachingDeviceAllocator.h")


def sub(old, new, count=1):
    def edit(text):
        assert old in text, old
        return text.replace(old, new, count)

    return edit


def rejected(base, edit, *words):
    with Mutated(base[0], base[1], edit) as (name, why):
        assert name is None, (base, name, why)
        for w in words:
            assert w in why, (w, why)
        return why


def accepted(base, edit, want):
    with Mutated(base[0], base[1], edit) as (name, why):
        assert name == want, (base, name, why)


def test_a_field_inserted_before_size_is_rejected():
    for base in (V1, V2):
        rejected(base, sub("  size_t size_;", "  int extra_;\n  size_t size_;"), "extra_")


def test_a_field_inserted_first_is_rejected():
    rejected(V2, sub("  Action action_;", "  int64_t id_;\n  Action action_;"), "id_")


def test_fields_reordered_are_rejected():
    rejected(V1, sub("  cudaStream_t stream_{};\n  size_t size_;", "  size_t size_;\n  cudaStream_t stream_{};"), "size_")


def test_a_changed_type_is_rejected():
    rejected(V1, sub("size_t addr_;", "uint32_t addr_;"), "uint32_t", "addr_")
    rejected(V2, sub("void* stream_{};", "cudaStream_t stream_{};"), "cudaStream_t")
    rejected(V2, sub("  c10::DeviceIndex device_;", "  int device_;"), "device_")
    rejected(V1, sub("std::shared_ptr<GatheredContext> context_;", "std::unique_ptr<GatheredContext> context_;"), "unique_ptr")


def test_an_action_inserted_before_oom_is_rejected():
    for base in (V1, V2):
        rejected(base, sub("    OOM", "    DEFRAGMENT,\n    OOM"), "DEFRAGMENT")


def test_an_action_renumbered_is_rejected():
    rejected(V2, sub("    OOM,", "    OOM = 9,"), "OOM=9")
    rejected(V1, sub("    ALLOC,", "    ALLOC = 1,"), "ALLOC=1")


def test_an_enum_with_another_underlying_type_is_rejected():
    rejected(V2, sub("enum Action {", "enum Action : uint8_t {"), "enum Action")
    rejected(V1, sub("enum Action {", "enum class Action {"), "enum class")


def test_a_huge_enumerator_after_oom_is_rejected():
    rejected(V2, sub("    ANNOTATE", "    ANNOTATE = 0x100000000"), "ANNOTATE")


def test_a_virtual_member_is_rejected():
    rejected(V2, sub("  Action action_;", "  virtual ~TraceEntry() = default;\n  Action action_;"), "virtual")


def test_preprocessor_lines_inside_are_rejected():
    rejected(V1, sub("  size_t size_;", "#ifdef USE_ROCM\n  int rocm_;\n#endif\n  size_t size_;"), "preprocessor")


def test_a_base_class_is_rejected():
    rejected(V2, sub("struct TraceEntry {", "struct TraceEntry : Base {"), "TraceEntry")


def test_a_template_is_rejected():
    rejected(V2, sub("struct TraceEntry {", "template <typename S>\nstruct TraceEntry {"), "template")


def test_a_second_definition_is_rejected():
    def edit(text):
        start = text.index("struct TraceEntry {")
        end = text.index("};", start) + 2
        return text[:end] + "\n" + text[start:end] + text[end:]

    rejected(V1, edit, "defined")


def test_no_definition_is_rejected():
    rejected(V2, sub("struct TraceEntry {", "struct TraceEntryV3 {"), "no definition")


def test_another_namespace_is_rejected():
    rejected(V2, sub("namespace c10::CachingDeviceAllocator {", "namespace c10::CachingDeviceAllocator::v3 {"), "namespace")


def test_a_changed_tracker_alias_is_rejected():
    rejected(
        V2,
        sub("using AllocatorTraceTracker = std::function<void(const TraceEntry&)>;", "using AllocatorTraceTracker = std::function<void(TraceEntry)>;"),
        "AllocatorTraceTracker",
    )


def test_a_wider_device_index_is_rejected():
    with Mutated("2.15.0", "c10/core/Device.h", sub("using DeviceIndex = int8_t;", "using DeviceIndex = int16_t;")) as (name, why):
        assert name is None and "int16_t" in why, why


def test_pragma_pack_is_rejected():
    rejected(V2, sub("namespace c10::CachingDeviceAllocator {", "#pragma pack(push, 1)\nnamespace c10::CachingDeviceAllocator {"), "pragma pack")


def test_a_member_hidden_in_a_declarator_is_rejected():
    rejected(V2, sub("  size_t size_;", "  decltype(addr_) other_;\n  size_t size_;"), "decltype")
    rejected(V2, sub("  size_t size_;", "  void (*hook_)(int);\n  size_t size_;"), "cannot read")
    rejected(V2, sub("  size_t size_;", "  std::function<void(int)> hook_;\n  size_t size_;"), "hook_")
    rejected(V2, sub("  size_t size_;", "  [[no_unique_address]] Empty e_;\n  size_t size_;"), "e_")
    rejected(V2, sub("  size_t size_;", "  int a_, b_;\n  size_t size_;"))


def test_a_function_does_not_hide_the_next_field():
    # a method with a trailing return type and one with a body, then a new field
    rejected(V2, sub("  size_t size_;", "  auto f() const -> int { return 1; }\n  int extra_;\n  size_t size_;"), "extra_")
    rejected(V2, sub("  size_t size_;", "  bool operator<(const TraceEntry& o) const { return addr_ < o.addr_; }\n  int extra_;\n  size_t size_;"), "extra_")


def test_comments_and_whitespace_do_not_matter():
    accepted(V1, sub("  size_t size_;", "  /* a { brace } and a ; */ size_t\n     // size_t wrong_;\n   size_    ;"), "v1")
    accepted(V2, sub("    OOM,", '    OOM /* = 3 */ , // "OOM"\n'), "v2")
    accepted(V2, sub("struct TraceEntry {", "struct   TraceEntry\n{"), "v2")
    accepted(V1, sub("  Action action_;", "  // struct TraceEntry { int x; };\n  Action action_;"), "v1")
    accepted(V2, sub("    ALLOC,", "    ALLOC = 0,"), "v2")


def test_members_that_take_no_room_and_later_fields_do_not_matter():
    accepted(V2, sub("  size_t size_;", "  static constexpr int kMax = 3;\n  using Ptr = void*;\n  size_t size_;"), "v2")
    accepted(V2, sub("  size_t size_;", "  size_t size_;\n  int64_t after_size_;"), "v2")
    accepted(V1, sub("  size_t size_;", "  size_t size_;\n  void note() {}"), "v1")
    accepted(V2, sub("    ANNOTATE", "    ANNOTATE,\n    LATER"), "v2")


def test_missing_headers_are_rejected():
    d = tempfile.mkdtemp(prefix="layout-")
    try:
        assert trace_entry_layout(d)[0] is None
        assert trace_entry_layout(os.path.join(d, "nowhere"))[0] is None
    finally:
        shutil.rmtree(d)


def test_unreadable_text_is_rejected():
    rejected(V2, sub("  size_t size_;", "  size_t size_; }}}"))
    rejected(V2, sub("struct TraceEntry {", "struct TraceEntry {{"))


if __name__ == "__main__":
    tests = [(n, f) for n, f in sorted(globals().items()) if n.startswith("test_") and callable(f)]
    for n, f in tests:
        f()
        print("ok", n)
    print("%d tests passed" % len(tests))
