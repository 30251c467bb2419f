//! Pulls against the loopback stand-in of the hub, faults included, and both judged by
//! the real `huggingface_hub` client (pinned in tests/hfhub-venv.sh): the stand-in must
//! serve its `snapshot_download`, and it must read our cache offline. The behaviour
//! checked is hfpy = huggingface/huggingface_hub@ee0a4510 (`_snapshot_download.py`,
//! `file_download.py`), installed as huggingface_hub 1.29.0.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use kubeairunway_modelcache_hub::testing::{Content, StandIn, StandInFile, commit_id};
use kubeairunway_modelcache_hub::{Error, Hub, HubOptions, PullOptions, PullReport, RepoId, pull};
use tempfile::TempDir;

const REPO: &str = "acme/tiny-model";
const BIG: &str = "model.safetensors";
const BIG_LEN: u64 = 6 << 20;

fn files(seed: u8) -> Vec<StandInFile> {
    vec![
        StandInFile::regular("config.json", format!("{{\"seed\": {seed}}}\n").as_bytes()),
        StandInFile::new(BIG, Content::Pattern { len: BIG_LEN, seed }, true),
        StandInFile::regular("tokenizer/vocab.txt", b"hello\nworld\n"),
        StandInFile::lfs("weights/part-00001.bin", &[seed; 1000]),
        StandInFile::regular("empty.txt", b""),
    ]
}

fn hub(stand_in: &StandIn, token: Option<&str>) -> Hub {
    Hub::new(&HubOptions {
        endpoint: stand_in.url.clone(),
        token: token.map(str::to_string),
        ..HubOptions::default()
    })
    .unwrap()
}

fn sha256_file(path: &Path) -> String {
    kubeairunway_modelcache_hub::hash::sha256(&std::fs::read(path).unwrap())
}

/// Every file of `expected` is in `snapshot` with its content, through a relative link.
fn assert_snapshot(snapshot: &Path, expected: &[StandInFile]) {
    for f in expected {
        let link = snapshot.join(&f.path);
        let target = std::fs::read_link(&link).unwrap();
        assert!(target.is_relative(), "{}: {}", f.path, target.display());
        assert!(
            target.ends_with(format!("blobs/{}", f.etag)),
            "{}",
            target.display()
        );
        assert_eq!(sha256_file(&link), f.sha256, "{}", f.path);
    }
}

fn blobs_dir(cache: &Path) -> PathBuf {
    cache.join("models--acme--tiny-model/blobs")
}

fn blob_names(cache: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(blobs_dir(cache))
        .map(|d| {
            d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// A stand-in serving `REPO` with `files(seed)` at `main` = commit "one", and an empty cache.
struct Fixture {
    stand_in: StandIn,
    commit: String,
    files: Vec<StandInFile>,
    cache: TempDir,
}

impl Fixture {
    async fn new(seed: u8) -> Self {
        let stand_in = StandIn::start().await;
        let commit = commit_id("one");
        let files = files(seed);
        stand_in.commit(REPO, "main", &commit, files.clone());
        Self {
            stand_in,
            commit,
            files,
            cache: tempfile::tempdir().unwrap(),
        }
    }

    async fn pull_with(
        &self,
        token: Option<&str>,
        revision: &str,
        options: &PullOptions,
    ) -> Result<PullReport, Error> {
        let repo = RepoId::parse(REPO).unwrap();
        pull(
            &hub(&self.stand_in, token),
            self.cache.path(),
            &repo,
            revision,
            options,
        )
        .await
    }

    /// `main`, default options, expected to succeed.
    async fn pull(&self) -> PullReport {
        self.pull_with(None, "main", &PullOptions::default())
            .await
            .unwrap()
    }

    /// `models--acme--tiny-model`.
    fn root(&self) -> PathBuf {
        self.cache.path().join("models--acme--tiny-model")
    }

    fn file(&self, path: &str) -> &StandInFile {
        self.files.iter().find(|f| f.path == path).unwrap()
    }

    /// The `Range` starts of the `GET`s of `path`, in order.
    fn gets(&self, path: &str) -> Vec<(Option<u64>, u16)> {
        self.stand_in
            .log()
            .into_iter()
            .filter(|l| l.method == "GET" && l.path.ends_with(path))
            .map(|l| (l.range_from, l.status))
            .collect()
    }
}

#[tokio::test]
async fn a_pull_writes_the_cache_layout_and_a_second_pull_downloads_nothing() {
    let f = Fixture::new(1).await;
    let report = f.pull().await;
    assert_eq!(report.commit, f.commit);
    assert_eq!(report.snapshot, f.root().join("snapshots").join(&f.commit));
    assert_eq!(report.files.len(), f.files.len());
    let total: u64 = f.files.iter().map(|f| f.content.len()).sum();
    assert_eq!((report.bytes_total, report.bytes_received), (total, total));
    assert_snapshot(&report.snapshot, &f.files);
    assert_eq!(
        std::fs::read_to_string(f.root().join("refs/main")).unwrap(),
        f.commit
    );
    // Nothing but finished blobs, each named by its etag.
    let mut etags: Vec<String> = f.files.iter().map(|f| f.etag.clone()).collect();
    etags.sort();
    assert_eq!(blob_names(f.cache.path()), etags);

    let again = f.pull().await;
    assert_eq!(again.bytes_received, 0);
    assert!(again.files.iter().all(|f| f.cached));
}

#[tokio::test]
async fn include_patterns_pull_only_what_they_match() {
    let f = Fixture::new(1).await;
    let options = PullOptions {
        include: vec!["*.json".into(), "tokenizer/".into()],
        ..PullOptions::default()
    };
    let report = f.pull_with(None, "main", &options).await.unwrap();
    let paths: Vec<&str> = report.files.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(paths, ["config.json", "tokenizer/vocab.txt"]);
    assert!(!report.snapshot.join(BIG).exists());
    assert_eq!(f.stand_in.sent(BIG), 0);
}

#[tokio::test]
async fn a_file_cut_off_midway_is_resumed_with_range() {
    let f = Fixture::new(2).await;
    let cut = BIG_LEN / 3;
    f.stand_in.die_after(BIG, cut);
    let report = f.pull().await;
    assert_snapshot(&report.snapshot, &f.files);
    let big = report.files.iter().find(|r| r.path == BIG).unwrap();
    assert_eq!(big.resumed, 1);
    let gets = f.gets(BIG);
    assert_eq!(gets.len(), 2, "{gets:?}");
    assert_eq!(gets[0], (None, 200));
    assert!(
        gets[1].0.is_some_and(|from| from > 0 && from <= cut),
        "{gets:?}"
    );
    assert_eq!(gets[1].1, 206);
    // Resumed, not restarted: fewer than twice the file crossed the wire.
    assert!(
        f.stand_in.sent(BIG) < 2 * BIG_LEN,
        "{}",
        f.stand_in.sent(BIG)
    );
    assert!(big.received < 2 * BIG_LEN);
}

#[tokio::test]
async fn a_pull_stopped_midway_leaves_nothing_visible_and_the_next_one_resumes() {
    let f = Fixture::new(3).await;
    let cut = BIG_LEN / 2;
    f.stand_in.die_after(BIG, cut);
    let no_retry = PullOptions {
        retries: 0,
        ..PullOptions::default()
    };
    let err = f.pull_with(None, "main", &no_retry).await.unwrap_err();
    assert!(err.transient(), "{err}");
    assert!(!f.root().join("snapshots").join(&f.commit).exists());
    assert!(!f.root().join("refs/main").exists());
    let etag = &f.file(BIG).etag;
    assert!(!blobs_dir(f.cache.path()).join(etag).exists());
    let partial = std::fs::metadata(blobs_dir(f.cache.path()).join(format!("{etag}.incomplete")))
        .unwrap()
        .len();
    assert!(partial > 0 && partial <= cut, "{partial}");

    // As after an agent restart: a new pull picks the partial file up.
    let report = f.pull_with(None, "main", &no_retry).await.unwrap();
    assert_snapshot(&report.snapshot, &f.files);
    assert_eq!(f.gets(BIG).last(), Some(&(Some(partial), 206)));
    assert!(f.stand_in.sent(BIG) < 2 * BIG_LEN);
}

/// The child half of the SIGKILL test: a pull as the node agent would run it, in a
/// process of its own (this test binary run again), which the parent kills midway.
/// Does nothing unless the parent set `MODELCACHE_CHILD_ENDPOINT`.
#[tokio::test]
async fn child_pull_for_the_sigkill_test() {
    let (Ok(endpoint), Ok(cache)) = (
        std::env::var("MODELCACHE_CHILD_ENDPOINT"),
        std::env::var("MODELCACHE_CHILD_CACHE"),
    ) else {
        return;
    };
    let hub = Hub::new(&HubOptions {
        endpoint,
        ..HubOptions::default()
    })
    .unwrap();
    let repo = RepoId::parse(REPO).unwrap();
    let _ = pull(
        &hub,
        Path::new(&cache),
        &repo,
        "main",
        &PullOptions::default(),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pull_killed_with_sigkill_midway_shows_nothing_and_the_next_one_resumes() {
    let f = Fixture::new(10).await;
    // The hub sends part of the big file and then nothing: the child is mid-file when killed.
    let stall = BIG_LEN / 2;
    f.stand_in.stall_after(BIG, stall);
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_pull_for_the_sigkill_test", "--nocapture"])
        .env("MODELCACHE_CHILD_ENDPOINT", &f.stand_in.url)
        .env("MODELCACHE_CHILD_CACHE", f.cache.path())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let etag = f.file(BIG).etag.clone();
    let incomplete = blobs_dir(f.cache.path()).join(format!("{etag}.incomplete"));
    // Wait until the child has written part of the file (its 1 MiB write buffer flushed).
    let mut waited = 0;
    while std::fs::metadata(&incomplete).map_or(0, |m| m.len()) < (1 << 20) {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the child pull ended early"
        );
        assert!(waited < 1200, "the child wrote nothing in 120 s");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        waited += 1;
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();

    let partial = std::fs::metadata(&incomplete).unwrap().len();
    assert!(partial >= 1 << 20 && partial <= stall, "{partial}");
    assert!(!blobs_dir(f.cache.path()).join(&etag).exists());
    assert!(!f.root().join("snapshots").join(&f.commit).exists());
    assert!(!f.root().join("refs/main").exists());

    let report = f.pull().await;
    assert_snapshot(&report.snapshot, &f.files);
    assert_eq!(f.gets(BIG).last(), Some(&(Some(partial), 206)));
    assert!(f.stand_in.sent(BIG) < 2 * BIG_LEN);
}

#[tokio::test]
async fn wrong_bytes_are_refused_and_nothing_is_published() {
    let f = Fixture::new(4).await;
    for path in [BIG, "config.json"] {
        f.stand_in.corrupt(path);
        let options = PullOptions {
            include: vec![path.into()],
            ..PullOptions::default()
        };
        let err = f.pull_with(None, "main", &options).await.unwrap_err();
        let file = f.file(path);
        let Error::Digest {
            path: p,
            algorithm,
            expected,
            actual,
        } = &err
        else {
            panic!("{path}: {err}");
        };
        assert_eq!(p, path);
        assert_eq!(*algorithm, if file.lfs { "sha256" } else { "git-sha1" });
        assert_eq!(expected, &file.etag);
        assert_ne!(actual, &file.etag);
        let message = err.to_string();
        for part in [path, expected.as_str(), actual.as_str()] {
            assert!(message.contains(part), "{message}");
        }
        assert!(
            blob_names(f.cache.path()).is_empty(),
            "{:?}",
            blob_names(f.cache.path())
        );
        assert!(!f.root().join("snapshots").join(&f.commit).exists());
        assert!(!f.root().join("refs/main").exists());
    }
}

/// The hub lists a gated repository's files to anyone and gates their downloads: files
/// already on disk (another cache's pull with its token) are no pass. One `HEAD` of a
/// file checks the token when nothing had to be downloaded.
#[tokio::test]
async fn files_already_on_disk_are_no_pass_to_a_gated_repo() {
    let f = Fixture::new(5).await;
    f.stand_in.gate_files(REPO, "hf_right");
    let default = PullOptions::default();
    let first = f
        .pull_with(Some("hf_right"), "main", &default)
        .await
        .unwrap();
    assert!(first.bytes_received > 0);
    for (token, with_token) in [(None, false), (Some("hf_wrong"), true)] {
        let err = f.pull_with(token, "main", &default).await.unwrap_err();
        assert!(
            matches!(err, Error::Gated { with_token: w, .. } if w == with_token),
            "{err}"
        );
    }
    let before = f.stand_in.log().len();
    let again = f
        .pull_with(Some("hf_right"), "main", &default)
        .await
        .unwrap();
    assert_eq!(again.bytes_received, 0, "nothing downloaded again");
    let files: Vec<_> = f.stand_in.log()[before..]
        .iter()
        .filter(|l| l.path.contains("/resolve/"))
        .map(|l| (l.method.clone(), l.status))
        .collect();
    assert_eq!(
        files,
        [("HEAD".to_string(), 200)],
        "one file request, a HEAD"
    );
}

#[tokio::test]
async fn a_gated_repo_needs_its_token() {
    let f = Fixture::new(5).await;
    f.stand_in.gate(REPO, "hf_right");
    let default = PullOptions::default();
    for (token, with_token) in [(None, false), (Some("hf_wrong"), true)] {
        let err = f.pull_with(token, "main", &default).await.unwrap_err();
        assert!(
            matches!(err, Error::Gated { with_token: w, .. } if w == with_token),
            "{err}"
        );
        assert!(err.to_string().contains("gated"), "{err}");
    }
    assert!(!f.root().join("snapshots").exists());
    let report = f
        .pull_with(Some("hf_right"), "main", &default)
        .await
        .unwrap();
    assert_eq!(report.commit, f.commit);
    let err = f
        .pull_with(Some("hf_right"), "v9", &default)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::RevisionNotFound { .. }), "{err}");

    let missing = RepoId::parse("acme/nothing").unwrap();
    let err = pull(
        &hub(&f.stand_in, None),
        f.cache.path(),
        &missing,
        "main",
        &default,
    )
    .await
    .unwrap_err();
    assert!(matches!(err, Error::RepoNotFound { .. }), "{err}");
}

#[tokio::test]
async fn a_moved_revision_updates_its_ref_and_keeps_the_old_snapshot() {
    let f = Fixture::new(6).await;
    f.pull().await;
    let two = commit_id("two");
    let new = files(7);
    f.stand_in.commit(REPO, "main", &two, new.clone());
    let report = f.pull().await;
    assert_eq!(report.commit, two);
    assert_eq!(
        std::fs::read_to_string(f.root().join("refs/main")).unwrap(),
        two
    );
    assert_snapshot(&f.root().join("snapshots").join(&f.commit), &f.files);
    assert_snapshot(&f.root().join("snapshots").join(&two), &new);
    // The unchanged file was not downloaded again.
    let vocab = report
        .files
        .iter()
        .find(|r| r.path == "tokenizer/vocab.txt")
        .unwrap();
    assert!(vocab.cached);

    // A pull by commit writes no ref.
    let by_commit = f
        .pull_with(None, &f.commit, &PullOptions::default())
        .await
        .unwrap();
    assert_eq!(by_commit.bytes_received, 0);
    assert!(!f.root().join("refs").join(&f.commit).exists());
}

#[tokio::test]
async fn hostile_names_are_refused_before_any_request() {
    let f = Fixture::new(1).await;
    for revision in ["../../etc", "/abs", "a//b", "a\\b"] {
        let err = f
            .pull_with(None, revision, &PullOptions::default())
            .await
            .unwrap_err();
        assert!(matches!(err, Error::Invalid { .. }), "{err}");
    }
    assert!(f.stand_in.log().is_empty());
    assert_eq!(std::fs::read_dir(f.cache.path()).unwrap().count(), 0);
}

// --- the judge: the real huggingface_hub client ---------------------------------------

use kubeairunway_modelcache_hub::testing::{judge, python};

/// sha256 of every file under the folder `snapshot_download` returns, by path.
const SNAPSHOT_PY: &str = r#"
import hashlib, json, os, sys
from huggingface_hub import snapshot_download, hf_hub_download
repo, rev, cache, files = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
local = os.environ.get("HF_HUB_OFFLINE") == "1"
folder = snapshot_download(repo, revision=rev, cache_dir=cache, local_files_only=local)
def sha(p):
    return hashlib.sha256(open(p, "rb").read()).hexdigest()
walked = {}
for root, _, names in os.walk(folder):
    for n in names:
        p = os.path.join(root, n)
        walked[os.path.relpath(p, folder)] = sha(p)
single = {f: sha(hf_hub_download(repo, f, revision=rev, cache_dir=cache, local_files_only=local)) for f in files}
print(json.dumps({"folder": folder, "walked": walked, "single": single}))
"#;

fn expected_shas(files: &[StandInFile]) -> serde_json::Value {
    files
        .iter()
        .map(|f| (f.path.clone(), serde_json::Value::from(f.sha256.clone())))
        .collect::<serde_json::Map<_, _>>()
        .into()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stand_in_serves_huggingface_hub_snapshot_download() {
    let Some(py) = judge() else { return };
    let f = Fixture::new(8).await;
    let (stand_in, commit, expected) = (&f.stand_in, &f.commit, &f.files);
    let cache = tempfile::tempdir().unwrap();
    let dir = cache.path().to_str().unwrap().to_string();
    let url = stand_in.url.clone();
    let answer = tokio::task::spawn_blocking(move || {
        python(
            &py,
            SNAPSHOT_PY,
            &[REPO, "main", &dir, "config.json"],
            &[("HF_ENDPOINT", &url)],
        )
    })
    .await
    .unwrap();
    assert_eq!(answer["walked"], expected_shas(expected));
    assert_eq!(answer["single"]["config.json"], expected[0].sha256.as_str());
    assert!(
        answer["folder"]
            .as_str()
            .unwrap()
            .ends_with(&format!("snapshots/{commit}"))
    );
    // It asked for what we serve: the model info, the tree, HEAD and GET of each file.
    let log = stand_in.log();
    assert!(log.iter().any(|l| {
        l.path
            .starts_with("/api/models/acme/tiny-model/revision/main")
    }));
    assert!(log.iter().all(|l| l.status < 400), "{log:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huggingface_hub_reads_our_cache_offline() {
    let Some(py) = judge() else { return };
    let f = Fixture::new(9).await;
    let report = f.pull().await;
    let Fixture {
        stand_in,
        files: expected,
        cache,
        ..
    } = f;
    drop(stand_in); // offline means offline
    let dir = cache.path().to_str().unwrap().to_string();
    let mut args = vec![REPO.to_string(), "main".into(), dir];
    args.extend(expected.iter().map(|f| f.path.clone()));
    let answer = tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        python(
            &py,
            SNAPSHOT_PY,
            &args,
            &[
                ("HF_HUB_OFFLINE", "1"),
                ("HF_ENDPOINT", "http://127.0.0.1:9"),
            ],
        )
    })
    .await
    .unwrap();
    assert_eq!(
        answer["folder"].as_str().unwrap(),
        report.snapshot.to_str().unwrap()
    );
    assert_eq!(answer["walked"], expected_shas(&expected));
    assert_eq!(answer["single"], expected_shas(&expected));
}

/// Browsing (the dashboard's Models page): a search, a parameter count and `config.json`,
/// read by our client and, from the same stand-in, by huggingface_hub's `list_models` and
/// `model_info(expand=["safetensors"])`, so the stand-in answers as the hub does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn search_parameters_and_config_for_choosing_a_model() {
    let f = Fixture::new(3).await;
    let stand_in = &f.stand_in;
    stand_in.commit("acme/tiny-chat", "main", &commit_id("chat"), files(4));
    stand_in.commit("other/thing", "main", &commit_id("thing"), files(5));
    stand_in.describe(REPO, 751_632_384, 10);
    stand_in.describe("acme/tiny-chat", 1_000, 500);
    let hub = hub(stand_in, None);
    let found = hub.search("tiny", 10).await.unwrap();
    let ids: Vec<&str> = found.iter().map(|m| m.id.as_str()).collect();
    assert_eq!(ids, ["acme/tiny-chat", REPO], "most downloaded first");
    assert_eq!(found[0].downloads, 500);
    assert_eq!(hub.search("tiny", 1).await.unwrap().len(), 1);
    let repo = RepoId::parse(REPO).unwrap();
    assert_eq!(hub.parameters(&repo).await.unwrap(), Some(751_632_384));
    assert_eq!(
        hub.parameters(&RepoId::parse("other/thing").unwrap())
            .await
            .unwrap(),
        None,
        "no safetensors metadata"
    );
    assert_eq!(hub.config(&repo).await.unwrap()["seed"], 3);
    let missing = hub
        .parameters(&RepoId::parse("acme/nothing").unwrap())
        .await;
    assert!(
        matches!(missing, Err(Error::RepoNotFound { .. })),
        "{missing:?}"
    );

    let Some(py) = judge() else { return };
    let url = stand_in.url.clone();
    let answer = tokio::task::spawn_blocking(move || {
        python(
            &py,
            r#"
import json, sys
from huggingface_hub import HfApi
api = HfApi(endpoint=sys.argv[1])
found = [m.id for m in api.list_models(search="tiny", limit=10)]
info = api.model_info(sys.argv[2], expand=["safetensors"])
print(json.dumps({"found": found, "total": info.safetensors.total}))
"#,
            &[&url, REPO],
            &[],
        )
    })
    .await
    .unwrap();
    assert_eq!(answer["found"], serde_json::json!(["acme/tiny-chat", REPO]));
    assert_eq!(answer["total"], 751_632_384);
}
