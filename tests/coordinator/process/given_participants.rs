//! SPEC 13: the all-in-one registers every participant it is given (`--participant
//! NAME=URL`) beside its built-in ones, and its banner lists them; a name a built-in one has
//! is refused at start, naming it. The "write your own participant" path, tried as a newcomer
//! would: the real binary, on its embedded default, and a participant of the test's own.

use holdfast::proto::coordinator_client::CoordinatorClient;
use holdfast::proto::reservation::State;

use super::{Holdfast, embedded_command, get_json, listen_addr, serving};
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
    // The operator's listing has it beside the built-in ones.
    let http = std::net::SocketAddr::new(listen.ip(), 8080);
    let listed = get_json(http, "/v1/admin/participants").await;
    let names: Vec<&str> = listed["participants"]
        .as_array()
        .unwrap_or_else(|| panic!("no participants in {listed}"))
        .iter()
        .filter_map(|p| p["name"].as_str())
        .collect();
    assert!(
        names.contains(&"car-park") && names.contains(&"seats"),
        "{listed}"
    );
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
    // The same through HOLDFAST_PARTICIPANTS and the config file.
    let file = dir.join("holdfast.toml");
    std::fs::write(&file, format!("[participants]\nrooms = \"{url}\"\n")).expect("the file");
    for (var, value, name) in [
        ("HOLDFAST_PARTICIPANTS", format!("noop={url}"), "noop"),
        ("HOLDFAST_CONFIG", file.display().to_string(), "rooms"),
    ] {
        let out = embedded_command(&dir, listen)
            .env(var, value)
            .output()
            .expect("run holdfast");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{var}: started with a second {name}");
        assert!(
            err.contains(&format!("--participant {name}=")),
            "{var}: {err}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
