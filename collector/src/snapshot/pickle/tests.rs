use super::*;

/// `pickle.dumps({"a": [1, -2, "x"], "b": None}, protocol=4)` as Python 3.11 writes it.
const SMALL: &[u8] = b"\x80\x04\x95\x1d\x00\x00\x00\x00\x00\x00\x00}\x94(\x8c\x01a\x94]\x94(K\x01J\xfe\xff\xff\xff\x8c\x01x\x94e\x8c\x01b\x94Nu.";

#[test]
fn a_dict_of_a_list_reads_as_python_wrote_it() {
    let p = read(SMALL).unwrap();
    let root = p.root.unwrap();
    let a = p.seq(p.get(root, "a").unwrap()).unwrap();
    assert_eq!(a[0], Value::Int(1));
    assert_eq!(a[1], Value::Int(-2));
    assert_eq!(p.str(a[2]), Some("x"));
    assert_eq!(p.get(root, "b"), Some(Value::None));
    assert_eq!(p.get(root, "c"), None);
}

#[test]
fn every_cut_of_a_pickle_is_an_error_never_a_panic() {
    for cut in 0..SMALL.len() - 1 {
        assert!(read(&SMALL[..cut]).is_err(), "cut at {cut}");
    }
}

#[test]
fn a_memo_reference_shares_instead_of_copying() {
    // A "billion laughs": l0 = ["x"]; each l(i+1) = [l(i)] * 2 through the memo, 60 deep.
    // Copied, it would hold 2^60 strings; shared, it is 61 lists.
    let mut b = vec![0x80, 4, b']', 0x94, 0x8c, 1, b'x', b'a'];
    for i in 0..60u8 {
        b.extend([b']', 0x94, b'(', b'h', i, b'h', i, b'e']);
    }
    b.push(b'.');
    let p = read(&b).unwrap();
    let mut v = p.root.unwrap();
    for _ in 0..60 {
        let items = p.seq(v).unwrap();
        assert_eq!(items.len(), 2);
        assert_eq!(items[0], items[1]);
        v = items[0];
    }
    assert_eq!(p.str(p.seq(v).unwrap()[0]), Some("x"));
}

#[test]
fn a_list_nested_a_million_deep_is_read_and_dropped_without_recursion() {
    let depth = 1_000_000;
    let mut b = vec![0x80, 4];
    b.extend(std::iter::repeat_n(b'(', depth));
    b.push(b']');
    b.extend(std::iter::repeat_n(b'l', depth));
    b.push(b'.');
    let p = read(&b).unwrap();
    assert!(p.seq(p.root.unwrap()).is_some());
    drop(p);
}

#[test]
fn a_list_that_holds_itself_is_a_handle_to_itself() {
    // l = []; l.append(l)
    let b = [0x80, 4, b']', 0x94, b'h', 0, b'a', b'.'];
    let p = read(&b).unwrap();
    let root = p.root.unwrap();
    assert_eq!(p.seq(root).unwrap(), &[root]);
}

#[test]
fn code_a_file_names_is_never_run() {
    // `os.system("touch pwned")` as pickle writes it: GLOBAL, args, REDUCE.
    let b = b"\x80\x02cos\nsystem\nq\x00X\x0b\x00\x00\x00touch pwnedq\x01\x85q\x02Rq\x03.";
    let p = read(b).unwrap();
    assert_eq!(p.root, Some(Value::Object));
    // STACK_GLOBAL, NEWOBJ and BUILD too.
    let b = b"\x80\x04\x8c\x02os\x8c\x06system\x93)\x81}b.";
    assert_eq!(read(b).unwrap().root, Some(Value::Object));
}

#[test]
fn persistent_ids_and_unknown_opcodes_are_named_errors() {
    let e = read(b"\x80\x02X\x01\x00\x00\x00xQ.").unwrap_err();
    assert!(e.what.contains("persistent"), "{e}");
    let e = read(b"\x80\x04\xff.").unwrap_err();
    assert!(e.what.contains("unknown pickle opcode 0xff"), "{e}");
    let e = read(b"\x80\x06N.").unwrap_err();
    assert!(e.what.contains("protocol 6"), "{e}");
}

#[test]
fn a_length_past_the_end_and_a_missing_memo_are_errors() {
    assert!(read(b"\x80\x04\x8d\xff\xff\xff\xff\xff\xff\xff\x7f").is_err());
    assert!(read(b"\x80\x04h\x05.").is_err());
    assert!(read(b"\x80\x04j\xff\xff\xff\xff.").is_err());
    assert!(read(b"\x80\x04r\xff\xff\xff\x7f.").is_err());
    // Opcodes that take from an empty stack or below a mark.
    assert!(read(b"\x80\x04a.").is_err());
    assert!(read(b"\x80\x04](a.").is_err());
    assert!(read(b"\x80\x04e.").is_err());
}

#[test]
fn integers_of_every_width_read_as_python_wrote_them() {
    // [255, 65535, 2**31-1, -2**31, 2**40, -1, 2**63-1, 2**64, True]
    let b = b"\x80\x04]\x94(K\xffM\xff\xffJ\xff\xff\xff\x7fJ\x00\x00\x00\x80\x8a\x06\x00\x00\x00\x00\x00\x01J\xff\xff\xff\xff\x8a\x08\xff\xff\xff\xff\xff\xff\xff\x7f\x8a\t\x00\x00\x00\x00\x00\x00\x00\x00\x01\x88e.";
    let p = read(b).unwrap();
    let v = p.seq(p.root.unwrap()).unwrap();
    assert_eq!(
        v,
        &[
            Value::Int(255),
            Value::Int(65535),
            Value::Int(i32::MAX as i64),
            Value::Int(i32::MIN as i64),
            Value::Int(1 << 40),
            Value::Int(-1),
            Value::Int(i64::MAX),
            Value::BigInt,
            Value::Bool(true),
        ]
    );
}
