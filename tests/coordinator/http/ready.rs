//! `/readyz` is ready only while the database takes writes (SPEC 7.4): on SQLite with its disk
//! full, reads still answer but every write fails, and the replica must leave the load
//! balancer; with room again it is ready again. The full disk is real: a small tmpfs the test
//! mounts (root only) and fills.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use holdfast::app;
use holdfast::store::SqliteStore;
use tokio::net::TcpListener;

use super::{HttpApp, get};
use crate::common::{hold, reserve_request};
use crate::common::{settings, spawn_fakes};

/// A tmpfs of `size` mounted on a fresh folder, unmounted and removed when dropped.
struct SmallDisk {
    dir: PathBuf,
}

impl SmallDisk {
    /// `None` when this process may not mount (not root).
    fn mount(size: &str) -> Option<SmallDisk> {
        let uid = Command::new("id").arg("-u").output().ok()?;
        if String::from_utf8_lossy(&uid.stdout).trim() != "0" {
            return None;
        }
        let dir = std::env::temp_dir().join(format!("holdfast-full-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).expect("the mount point");
        let mounted = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&dir)
            .status()
            .expect("run mount");
        assert!(mounted.success(), "mount -t tmpfs as root failed");
        Some(SmallDisk { dir })
    }

    /// Writes a file until the disk has no room left.
    fn fill(&self) -> PathBuf {
        use std::io::Write;
        let filler = self.dir.join("filler");
        let mut file = std::fs::File::create(&filler).expect("the filler");
        let block = vec![0u8; 64 * 1024];
        while file.write_all(&block).is_ok() {}
        let _ = file.write_all(&[0u8; 512]);
        let _ = file.flush();
        filler
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A coordinator on a SQLite file in `dir`, with its HTTP listener.
async fn spawn_on_sqlite(dir: &Path, participants: &[(&str, &str)]) -> HttpApp {
    let url = format!("sqlite://{}", dir.join("holdfast.db").display());
    let store = SqliteStore::connect(&url, 4).await.expect("the store");
    let grpc = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let http = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let grpc_addr = grpc.local_addr().expect("addr");
    let base = format!("http://{}", http.local_addr().expect("addr"));
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let settings = settings(participants);
    tokio::spawn(async move {
        let shutdown = async {
            let _ = rx.await;
        };
        let _ =
            app::serve_coordinator_with_http(settings, store, grpc, Some(http.into()), shutdown)
                .await;
    });
    HttpApp::connect(grpc_addr, base, tx).await
}

#[tokio::test]
async fn readiness_follows_whether_sqlite_takes_writes() {
    let Some(disk) = SmallDisk::mount("8m") else {
        eprintln!("skipped: mounting a full disk needs root");
        return;
    };
    let fakes = spawn_fakes(&["seats"]).await;
    let mut app = spawn_on_sqlite(&disk.dir, &[("seats", &fakes.get("seats").url)]).await;
    let ready = get(&app, "/readyz", None).await;
    assert_eq!(ready.status, 200, "{ready:?}");

    // The disk fills up: Reserves fail (a write that still found room in the WAL file may
    // pass; the WAL soon needs more), while reads keep answering.
    let filler = disk.fill();
    let mut refused = false;
    for i in 0..200 {
        let request = reserve_request(&format!("full-{i}"), vec![hold("seats", &format!("S{i}"))]);
        if app.grpc.reserve(request).await.is_err() {
            refused = true;
            break;
        }
    }
    assert!(refused, "every Reserve succeeded on a full disk");
    let listed = get(&app, "/v1/reservations?page_size=1", None).await;
    assert_eq!(listed.status, 200, "reads answer: {listed:?}");
    let unready = get(&app, "/readyz", None).await;
    assert_eq!(unready.status, 503, "ready while writes fail: {unready:?}");
    assert!(unready.text.contains("refuses writes"), "{unready:?}");

    // Room again: ready again, and a Reserve is taken.
    std::fs::remove_file(&filler).expect("remove the filler");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        if get(&app, "/readyz", None).await.status == 200 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not ready after the disk has room"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let again = reserve_request("after", vec![hold("seats", "after")]);
    assert!(app.grpc.reserve(again).await.is_ok());
}
