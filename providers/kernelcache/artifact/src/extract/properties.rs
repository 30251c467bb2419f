use super::*;
use flate2::Compression;
use flate2::write::GzEncoder;
use proptest::prelude::*;
use std::os::unix::fs::PermissionsExt;

#[derive(Clone, Debug)]
struct Arb {
    path: String,
    kind: EntryType,
    data: Vec<u8>,
    link: Option<String>,
    mode: u32,
}

fn layer(entries: &[Arb]) -> Vec<u8> {
    let mut builder = tar::Builder::new(GzEncoder::new(Vec::new(), Compression::fast()));
    for e in entries {
        let mut header = tar::Header::new_gnu();
        let name = &mut header.as_old_mut().name;
        let n = e.path.len().min(99);
        name[..n].copy_from_slice(&e.path.as_bytes()[..n]);
        header.set_entry_type(e.kind);
        let data: &[u8] = if matches!(e.kind, EntryType::Regular | EntryType::Continuous) {
            &e.data
        } else {
            &[]
        };
        header.set_size(data.len() as u64);
        header.set_mode(e.mode);
        if let Some(link) = &e.link {
            let l = &mut header.as_old_mut().linkname;
            let n = link.len().min(99);
            l[..n].copy_from_slice(&link.as_bytes()[..n]);
        }
        header.set_cksum();
        builder.append(&header, data).unwrap();
    }
    builder.into_inner().unwrap().finish().unwrap()
}

/// Every path below `dir` (not following links) with its metadata.
fn tree(dir: &Path) -> Vec<(PathBuf, fs::Metadata)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap().flatten() {
            let meta = e.path().symlink_metadata().unwrap();
            if meta.is_dir() {
                stack.push(e.path());
            }
            out.push((e.path(), meta));
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

fn snapshot(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    tree(dir)
        .into_iter()
        .map(|(p, m)| {
            let content = if m.is_file() {
                fs::read(&p).unwrap()
            } else {
                Vec::new()
            };
            (p, content)
        })
        .collect()
}

/// Extract `entries` into a sandbox and check the properties; the result for the
/// caller's own assertions.
fn check(entries: &[Arb]) -> Result<Extracted, ExtractError> {
    let sandbox = tempfile::tempdir().unwrap();
    let outside = sandbox.path().join("outside");
    fs::create_dir_all(outside.join("etc")).unwrap();
    fs::write(outside.join("etc/secret"), b"secret").unwrap();
    let before = snapshot(&outside);
    let root = sandbox.path().join("outside/cache-parent/cache");
    let target = root.join("ns/name/sha256-abc");
    let result = extract(
        &layer(entries)[..],
        &root,
        &target,
        Limits {
            max_bytes: 256,
            max_entries: 12,
        },
    );
    let after: Vec<_> = snapshot(&outside)
        .into_iter()
        .filter(|(p, _)| !p.starts_with(&root))
        .collect();
    let before: Vec<_> = before
        .into_iter()
        .chain([
            (outside.join("cache-parent"), Vec::new()),
            (root.clone(), Vec::new()),
        ])
        .filter(|(p, _)| !p.starts_with(&root))
        .collect();
    let mut before_sorted = before;
    before_sorted.sort();
    assert_eq!(
        after, before_sorted,
        "nothing outside the cache root changes"
    );
    if result.is_ok() {
        let real_target = fs::canonicalize(&target).unwrap();
        for (path, meta) in tree(&target) {
            assert!(
                meta.is_file() || meta.is_dir(),
                "{} is neither a file nor a directory",
                path.display()
            );
            assert_eq!(
                meta.permissions().mode() & 0o7000,
                0,
                "{} has a special mode bit",
                path.display()
            );
            let real = fs::canonicalize(&path).unwrap();
            assert!(real.starts_with(&real_target), "{} escapes", path.display());
        }
        for (path, _) in tree(&root) {
            assert!(
                path.starts_with(&target) || target.starts_with(&path),
                "{} besides the target",
                path.display()
            );
        }
    } else {
        assert!(!target.exists(), "no target after an error");
        assert!(tree(&root).is_empty(), "root left empty after an error");
    }
    result
}

#[test]
fn the_escaping_chain_and_its_variants_keep_the_properties() {
    let link = |path: &str, to: &str| Arb {
        path: path.into(),
        kind: EntryType::Symlink,
        data: Vec::new(),
        link: Some(to.into()),
        mode: 0o777,
    };
    let chain = [
        link("d1/d2/d3/d4/d5/d6/d7/d8/up", "../../../../../../../.."),
        link(
            "io.triton.manifest/manifest.json",
            "../d1/d2/d3/d4/d5/d6/d7/d8/up/../../../../../etc/secret",
        ),
    ];
    assert!(check(&chain).is_err());
    let hard = Arb {
        path: "io.triton.manifest/manifest.json".into(),
        kind: EntryType::Link,
        data: Vec::new(),
        link: Some("d1/d2/d3/d4/d5/d6/d7/d8/up/../../../../../etc/secret".into()),
        mode: 0o644,
    };
    assert!(check(&[chain[0].clone(), hard]).is_err());
    let setuid = Arb {
        path: "io.triton.cache/x".into(),
        kind: EntryType::Regular,
        data: b"#!/bin/sh".to_vec(),
        link: None,
        mode: 0o6755,
    };
    assert!(check(&[setuid]).is_ok());
}

fn component() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("a".to_string()),
        Just("b".to_string()),
        Just("io.triton.cache".to_string()),
        Just("..".to_string()),
        Just(".".to_string()),
        Just(String::new()),
        Just("etc".to_string()),
        Just("up".to_string()),
        Just("outside".to_string()),
    ]
}

fn path() -> impl Strategy<Value = String> {
    (any::<bool>(), proptest::collection::vec(component(), 1..6)).prop_map(|(abs, c)| {
        let joined = c.join("/");
        if abs { format!("/{joined}") } else { joined }
    })
}

fn kind() -> impl Strategy<Value = EntryType> {
    prop_oneof![
        4 => Just(EntryType::Regular),
        3 => Just(EntryType::Directory),
        2 => Just(EntryType::Symlink),
        2 => Just(EntryType::Link),
        1 => Just(EntryType::Char),
        1 => Just(EntryType::Block),
        1 => Just(EntryType::Fifo),
        1 => Just(EntryType::GNUSparse),
    ]
}

fn entry() -> impl Strategy<Value = Arb> {
    (
        path(),
        kind(),
        proptest::collection::vec(any::<u8>(), 0..80),
        proptest::option::of(path()),
        0u32..0o10000,
    )
        .prop_map(|(path, kind, data, link, mode)| Arb {
            path,
            kind,
            data,
            link,
            mode,
        })
}

proptest! {
    #[test]
    fn arbitrary_layers_never_write_outside_the_target(
        entries in proptest::collection::vec(entry(), 0..14)
    ) {
        let _ = check(&entries);
    }
}
