use super::*;
use flate2::Compression;
use flate2::write::GzEncoder;

/// A tar entry spelled out, with paths written raw (the tar crate's builder refuses
/// the malicious ones we need).
struct Raw<'a> {
    path: &'a str,
    kind: EntryType,
    data: &'a [u8],
    link: Option<&'a str>,
}

fn file<'a>(path: &'a str, data: &'a [u8]) -> Raw<'a> {
    Raw {
        path,
        kind: EntryType::Regular,
        data,
        link: None,
    }
}

#[test]
fn entry_kinds_only_directories_files_and_inner_hard_links_are_extracted() {
    assert_eq!(entry_kind(EntryType::Directory), EntryKind::Directory);
    assert_eq!(entry_kind(EntryType::Regular), EntryKind::File);
    assert_eq!(entry_kind(EntryType::Continuous), EntryKind::File);
    assert_eq!(entry_kind(EntryType::Symlink), EntryKind::Symlink);
    assert_eq!(entry_kind(EntryType::Link), EntryKind::HardLink);
    for header in [
        EntryType::XHeader,
        EntryType::XGlobalHeader,
        EntryType::GNULongName,
        EntryType::GNULongLink,
    ] {
        assert_eq!(entry_kind(header), EntryKind::Metadata);
    }
    assert_eq!(
        entry_kind(EntryType::Char),
        EntryKind::Special("character device".into())
    );
    assert_eq!(
        entry_kind(EntryType::Block),
        EntryKind::Special("block device".into())
    );
    assert_eq!(
        entry_kind(EntryType::Fifo),
        EntryKind::Special("FIFO".into())
    );
    assert!(matches!(
        entry_kind(EntryType::GNUSparse),
        EntryKind::Special(k) if k.starts_with("special entry")
    ));
}

fn layer(entries: &[Raw<'_>]) -> Vec<u8> {
    let mut builder = tar::Builder::new(GzEncoder::new(Vec::new(), Compression::fast()));
    for e in entries {
        let mut header = tar::Header::new_gnu();
        let name = &mut header.as_old_mut().name;
        name[..e.path.len()].copy_from_slice(e.path.as_bytes());
        header.set_entry_type(e.kind);
        header.set_size(e.data.len() as u64);
        header.set_mode(0o644);
        if let Some(link) = e.link {
            let l = &mut header.as_old_mut().linkname;
            l[..link.len()].copy_from_slice(link.as_bytes());
        }
        header.set_cksum();
        builder.append(&header, e.data).unwrap();
    }
    builder.into_inner().unwrap().finish().unwrap()
}

fn run(
    entries: &[Raw<'_>],
    limits: Limits,
) -> (tempfile::TempDir, Result<Extracted, ExtractError>) {
    let root = tempfile::tempdir().unwrap();
    let cache_root = root.path().join("cache");
    let result = extract(
        &layer(entries)[..],
        &cache_root,
        &cache_root.join("ns/name/sha256-abc"),
        limits,
    );
    (root, result)
}

/// Every file under `dir`, relative.
fn listing(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            out.push(p.strip_prefix(dir).unwrap().display().to_string());
            if e.file_type().unwrap().is_dir() {
                stack.push(p);
            }
        }
    }
    out.sort();
    out
}

fn refused(entries: &[Raw<'_>]) -> ExtractError {
    let (root, result) = run(entries, Limits::default());
    let err = result.unwrap_err();
    // Nothing outside the cache root, and nothing but the (empty) root inside it.
    assert_eq!(listing(root.path()), ["cache"], "after {err}");
    err
}

#[test]
fn extracts_a_triton_cache_atomically() {
    let entries = [
        Raw {
            path: "io.triton.cache/",
            kind: EntryType::Directory,
            data: b"",
            link: None,
        },
        file("io.triton.cache/ABC/add_kernel.json", b"{}"),
        file("io.triton.cache/ABC/add_kernel.hsaco", b"\x7fELF"),
        Raw {
            path: "io.triton.cache/ABC/hard.json",
            kind: EntryType::Link,
            data: b"",
            link: Some("io.triton.cache/ABC/add_kernel.json"),
        },
        file("io.triton.manifest/manifest.json", b"{\"triton\":[]}"),
    ];
    let (root, result) = run(&entries, Limits::default());
    let stats = result.unwrap();
    assert_eq!(
        (stats.files, stats.bytes, stats.already_present),
        (4, 2 + 4 + 13, false)
    );
    let target = root.path().join("cache/ns/name/sha256-abc");
    assert_eq!(
        fs::read_to_string(target.join("io.triton.cache/ABC/hard.json")).unwrap(),
        "{}"
    );
    assert_eq!(
        listing(&root.path().join("cache")),
        [
            "ns",
            "ns/name",
            "ns/name/sha256-abc",
            "ns/name/sha256-abc/io.triton.cache",
            "ns/name/sha256-abc/io.triton.cache/ABC",
            "ns/name/sha256-abc/io.triton.cache/ABC/add_kernel.hsaco",
            "ns/name/sha256-abc/io.triton.cache/ABC/add_kernel.json",
            "ns/name/sha256-abc/io.triton.cache/ABC/hard.json",
            "ns/name/sha256-abc/io.triton.manifest",
            "ns/name/sha256-abc/io.triton.manifest/manifest.json",
        ]
    );
    // A second run finds it in place and writes nothing.
    let again = extract(
        &layer(&entries)[..],
        &root.path().join("cache"),
        &target,
        Limits::default(),
    )
    .unwrap();
    assert!(again.already_present);
}

#[test]
fn refuses_dot_dot() {
    assert!(
        matches!(refused(&[file("io.triton.cache/../../evil", b"x")]), ExtractError::ParentDir(p) if p == "io.triton.cache/../../evil")
    );
}

#[test]
fn refuses_absolute_paths() {
    assert!(matches!(
        refused(&[file("/etc/cron.d/evil", b"x")]),
        ExtractError::AbsolutePath(_)
    ));
}

#[test]
fn refuses_every_symlink() {
    for target in ["../../etc", "/etc/passwd", "add_kernel.json", "."] {
        let e = refused(&[
            file("io.triton.cache/add_kernel.json", b"{}"),
            Raw {
                path: "io.triton.cache/l",
                kind: EntryType::Symlink,
                data: b"",
                link: Some(target),
            },
        ]);
        assert!(matches!(e, ExtractError::Link { .. }), "{e}");
    }
}

/// The chain from the review: each link is harmless as text, together they resolve
/// outside the cache (`up` is the cache root, five more `..` climb out of it).
fn escaping_chain() -> Vec<Raw<'static>> {
    vec![
        Raw {
            path: "d1/d2/d3/d4/d5/d6/d7/d8/up",
            kind: EntryType::Symlink,
            data: b"",
            link: Some("../../../../../../../.."),
        },
        Raw {
            path: "io.triton.manifest/manifest.json",
            kind: EntryType::Symlink,
            data: b"",
            link: Some("../d1/d2/d3/d4/d5/d6/d7/d8/up/../../../../../etc/secret"),
        },
    ]
}

#[test]
fn refuses_a_chain_of_links_that_resolves_outside() {
    let e = refused(&escaping_chain());
    assert!(matches!(e, ExtractError::Link { .. }), "{e}");
    assert_eq!(
        e.to_string(),
        "entry \"d1/d2/d3/d4/d5/d6/d7/d8/up\" is a symbolic link (to \"../../../../../../../..\"): kernel cache layers may not hold symbolic links"
    );
}

#[test]
fn refuses_escaping_hardlinks() {
    let e = refused(&[Raw {
        path: "h",
        kind: EntryType::Link,
        data: b"",
        link: Some("../../../etc/shadow"),
    }]);
    assert!(matches!(e, ExtractError::LinkEscapes { .. }), "{e}");
    let e = refused(&[Raw {
        path: "h",
        kind: EntryType::Link,
        data: b"",
        link: Some("/etc/shadow"),
    }]);
    assert!(matches!(e, ExtractError::LinkEscapes { .. }), "{e}");
    let e = refused(&[Raw {
        path: "h",
        kind: EntryType::Link,
        data: b"",
        link: Some("not-there"),
    }]);
    assert!(matches!(e, ExtractError::LinkEscapes { .. }), "{e}");
}

#[test]
fn refuses_device_files_and_fifos() {
    for (kind, name) in [
        (EntryType::Char, "character device"),
        (EntryType::Block, "block device"),
        (EntryType::Fifo, "FIFO"),
    ] {
        let e = refused(&[Raw {
            path: "dev",
            kind,
            data: b"",
            link: None,
        }]);
        assert!(
            matches!(&e, ExtractError::SpecialFile { kind, .. } if kind == name),
            "{e}"
        );
    }
}

#[test]
fn refuses_oversized_layers_and_too_many_entries() {
    let (root, r) = run(
        &[file("a", &[0u8; 600]), file("b", &[0u8; 600])],
        Limits {
            max_bytes: 1000,
            max_entries: 10,
        },
    );
    assert!(matches!(
        r.unwrap_err(),
        ExtractError::TooLarge { limit: 1000 }
    ));
    assert_eq!(listing(root.path()), ["cache"]);
    let (root, r) = run(
        &[file("a", b"1"), file("b", b"2"), file("c", b"3")],
        Limits {
            max_bytes: 1000,
            max_entries: 2,
        },
    );
    assert!(matches!(
        r.unwrap_err(),
        ExtractError::TooManyEntries { limit: 2 }
    ));
    assert_eq!(listing(root.path()), ["cache"]);
}

#[test]
fn refuses_a_file_replacing_a_file_or_a_directory() {
    let e = refused(&[file("x", b"one"), file("x", b"over")]);
    assert!(matches!(e, ExtractError::Conflict(_)), "{e}");
    let e = refused(&[file("x/y", b"one"), file("x", b"over")]);
    assert!(matches!(e, ExtractError::Conflict(_)), "{e}");
}

#[test]
fn a_second_cache_of_a_digest_is_hard_links_of_the_first() {
    use std::os::unix::fs::MetadataExt as _;
    let entries = [
        file("io.triton.cache/H/k.json", b"{}"),
        file("io.triton.manifest/manifest.json", b"{\"triton\":[]}"),
    ];
    let (root, result) = run(&entries, Limits::default());
    result.unwrap();
    let cache = root.path().join("cache");
    let first = cache.join("ns/name/sha256-abc");
    let second = cache.join("other/name/sha256-abc");
    let stats = link_checked(&first, &cache, &second, |dir| {
        // What a check changes by write-then-rename stays in the new copy only.
        crate::files::replace(&dir.join("io.triton.cache/H/k.json"), b"[]", 0o644).map_err(|e| {
            ExtractError::Io {
                context: "rewrite".into(),
                source: e,
            }
        })
    })
    .unwrap();
    assert_eq!((stats.files, stats.already_present), (2, false));
    let ino = |p: &Path| fs::metadata(p).unwrap().ino();
    assert_eq!(
        ino(&first.join("io.triton.manifest/manifest.json")),
        ino(&second.join("io.triton.manifest/manifest.json"))
    );
    assert_eq!(
        fs::read(first.join("io.triton.cache/H/k.json")).unwrap(),
        b"{}"
    );
    assert_eq!(
        fs::read(second.join("io.triton.cache/H/k.json")).unwrap(),
        b"[]"
    );
    // A failed check leaves nothing.
    let third = cache.join("third/name/sha256-abc");
    let failed = link_checked(&first, &cache, &third, |_| {
        Err(ExtractError::Conflict("check".into()))
    });
    assert!(failed.is_err());
    assert!(!third.exists());
    assert!(!fs::read_dir(&cache).unwrap().any(|e| {
        e.unwrap()
            .file_name()
            .to_string_lossy()
            .starts_with(".staging-")
    }));
}

#[test]
fn a_corrupt_layer_is_an_error_not_a_panic() {
    let root = tempfile::tempdir().unwrap();
    let e = extract(
        &b"not gzip at all"[..],
        root.path(),
        &root.path().join("t"),
        Limits::default(),
    )
    .unwrap_err();
    assert!(matches!(e, ExtractError::Io { .. }), "{e}");
    assert!(!root.path().join("t").exists());
}

/// `layer`'s tar, uncompressed.
fn plain(entries: &[Raw<'_>]) -> Vec<u8> {
    let mut tar = Vec::new();
    flate2::read::GzDecoder::new(&layer(entries)[..])
        .read_to_end(&mut tar)
        .unwrap();
    tar
}

fn zstd(bytes: &[u8]) -> Vec<u8> {
    ruzstd::encoding::compress_to_vec(bytes, ruzstd::encoding::CompressionLevel::Fastest)
}

fn unpack_zstd(layer: &[u8]) -> (tempfile::TempDir, Result<Extracted, ExtractError>) {
    let dir = tempfile::tempdir().unwrap();
    let result = unpack_into(
        layer,
        super::Compression::Zstd,
        dir.path(),
        Limits::default(),
    );
    (dir, result)
}

/// A zstd tar is extracted as a gzip one is, from one frame or several (pzstd writes
/// several), with the same refusals.
#[test]
fn zstd_tars_are_extracted_from_one_frame_or_several() {
    let entries = [file("a/one.bin", &[1u8; 5000]), file("two.txt", b"two")];
    let tar = plain(&entries);
    let (half, rest) = tar.split_at(tar.len() / 2 + 7);
    for (what, layer) in [
        ("one frame", zstd(&tar)),
        ("two frames", [zstd(half), zstd(rest)].concat()),
    ] {
        let (dir, result) = unpack_zstd(&layer);
        let extracted = result.unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(extracted.files, 2, "{what}");
        assert_eq!(fs::read(dir.path().join("a/one.bin")).unwrap(), [1u8; 5000]);
        assert_eq!(fs::read(dir.path().join("two.txt")).unwrap(), b"two");
    }
    let (_dir, result) = unpack_zstd(&zstd(&plain(&[file("../escape", b"x")])));
    assert!(
        matches!(result, Err(ExtractError::ParentDir(_))),
        "{result:?}"
    );
}

/// A frame asking for a window over the limit is refused before anything is allocated for
/// it, and a stream that is not zstd is refused as the layer's, not as a disk error.
#[test]
fn zstd_frames_over_the_window_limit_or_malformed_are_refused() {
    // Magic, a descriptor without content size, a window of 2^(10 + 20) = 1 GiB.
    let huge_window = [0x28, 0xB5, 0x2F, 0xFD, 0x00, 20 << 3, 0, 0, 0];
    let (_dir, result) = unpack_zstd(&huge_window);
    match result {
        Err(ExtractError::Compressed(why)) => assert!(why.contains("window"), "{why}"),
        other => panic!("{other:?}"),
    }
    let (_dir, result) = unpack_zstd(b"not zstd at all, just text");
    assert!(
        matches!(result, Err(ExtractError::Compressed(_))),
        "{result:?}"
    );
    // A valid frame header, then garbage for its blocks.
    let mut broken = zstd(&plain(&[file("f", &[7u8; 4096])]));
    let at = broken.len() / 2;
    broken.truncate(at);
    broken.extend_from_slice(&[0xFF; 64]);
    let (_dir, result) = unpack_zstd(&broken);
    assert!(
        matches!(result, Err(ExtractError::Compressed(_))),
        "{result:?}"
    );
}
