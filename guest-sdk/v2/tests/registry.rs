//! The v2 SDK against `abi/v2/registry.json`: its import module, the native `log`'s limit and
//! signature, and every carried-over entry keeping its v1 descriptor.

#[path = "../../tests/common/mod.rs"]
mod common;

use common::{parse, repo_path};
use wasihost_guest_v2::{abi, log, ABI_VERSION, IMPORT_MODULE};

#[test]
fn constants_match_the_v2_registry() {
    let text = std::fs::read_to_string(repo_path("../abi/v2/registry.json")).expect("registry.json");
    let reg = parse(&text);
    assert_eq!(reg.get("abi_major").unwrap().as_i128(), Some(2));
    assert_eq!(reg.get("import_module").unwrap().as_str(), Some(IMPORT_MODULE));
    assert_eq!(ABI_VERSION, "2.0");
    let functions = reg.get("functions").unwrap().as_array().unwrap();
    assert_eq!(functions.len(), abi::HOST_FUNCTIONS.len());
    for f in functions {
        let name = f.get("name").unwrap().as_str().unwrap();
        assert_eq!(f.get("since").unwrap().as_str(), Some("2.0"), "{}", name);
        if name == "log" {
            assert_eq!(f.get("convention").unwrap().as_str(), Some("native"));
            assert_eq!(f.get("params").unwrap().as_array().unwrap().len(), 3);
            assert_eq!(f.get("max_request_bytes").unwrap().as_i128(), Some(log::MAX_MESSAGE_BYTES as i128));
            continue;
        }
        // Carried over: the v1 descriptor (limits, capability) the SDK calls it with holds.
        let ours = abi::HOST_FUNCTIONS.iter().find(|h| h.name == name).expect(name);
        assert_eq!(f.get("capability").unwrap().as_str(), Some(ours.capability), "{}", name);
        assert_eq!(f.get("max_request_bytes").unwrap().as_i128(), Some(ours.max_request_bytes as i128), "{}", name);
        assert_eq!(f.get("max_response_bytes").unwrap().as_i128(), Some(ours.max_response_bytes as i128), "{}", name);
        assert!(f.get("convention").is_none(), "{}", name);
    }
}

#[test]
fn off_wasm_the_imports_are_stand_ins() {
    let err = log::write(log::Level::Info, "hello").unwrap_err();
    assert_eq!(err.status(), wasihost_guest_v2::Status::UNSUPPORTED);
    let too_long = "x".repeat(log::MAX_MESSAGE_BYTES + 1);
    let err = log::write(log::Level::Info, &too_long).unwrap_err();
    assert_eq!(err.status(), wasihost_guest_v2::Status::PAYLOAD_TOO_LARGE);
    assert!(wasihost_guest_v2::clock::now_monotonic().is_err());
}
