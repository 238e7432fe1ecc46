//! SPEC 13: the all-in-one registers every participant it is given (`--participant
//! NAME=URL`) beside its built-in ones, and its banner lists them; a name a built-in one has
//! is refused at start, naming it. The "write your own participant" path, tried as a newcomer
//! would: the real binary, on its embedded default, and a participant of the test's own.

use holdfast::proto::coordinator_client::CoordinatorClient;
use holdfast::proto::reservation::State;

use super::{Holdfast, embedded_command, listen_addr, serving};
use crate::common::{hold, reserve_request, spawn_fakes, state_of};

#[tokio::test]
async fn the_all_in_one_registers_a_participant_it_is_given() {
    let fakes = spawn_fakes(&["car-park"]).await;
    let url = fakes.get("car-park").url.clone();
    let dir =
        std::env::temp_dir().join(format!("holdfast-given-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).expect("temp folder");
    let listen = listen_addr(22);
    let log = dir.join("holdfast.log");
    let mut cmd = embedded_command(&dir, listen);
    cmd.args(["--participant", &format!("car-park={url}")]);
    let mut process = Holdfast::spawn(cmd, log.clone());
    serving(&mut process, listen).await;

    let output = std::fs::read_to_string(&log).expect("the output");
    let address = url.trim_start_matches("http://");
    assert!(
        output.lines().any(|l| {
            let words: Vec<&str> = l.split_whitespace().collect();
            words == ["participant", "car-park", address]
        }),
        "the banner does not list car-park at {address}:\n{output}"
    );
    let mut client = CoordinatorClient::connect(format!("http://{listen}"))
        .await
        .expect("the coordinator");
    let held = client
        .reserve(reserve_request("given-1", vec![hold("car-park", "bay-7")]))
        .await
        .expect("a Reserve on the given participant")
        .into_inner();
    assert_eq!(state_of(&held), State::Held, "{held:?}");
    assert_eq!(fakes.log.count("car-park", "Try"), 1);
    drop(process);

    // A name of a built-in participant is refused at start, naming the flag.
    let mut cmd = embedded_command(&dir, listen);
    cmd.args(["--participant", &format!("seats={url}")]);
    let out = cmd.output().expect("run holdfast");
    assert!(!out.status.success(), "started with a second `seats`");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--participant seats=") && err.contains("give yours another name"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
