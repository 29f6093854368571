//! The SDK's ABI constants against `abi/v1/registry.json`, the normative registry.

mod common;

use common::{parse, repo_path};
use wasihost_guest::abi::{self, Status};

#[test]
fn constants_match_the_registry() {
    let text = std::fs::read_to_string(repo_path("abi/v1/registry.json")).expect("registry.json");
    let reg = parse(&text);
    assert_eq!(reg.get("abi_major").unwrap().as_i128(), Some(abi::ABI_MAJOR as i128));
    assert_eq!(reg.get("import_module").unwrap().as_str(), Some(abi::IMPORT_MODULE));
    assert_eq!(reg.get("marker_section").unwrap().as_str(), Some(abi::MARKER_SECTION));
    assert_eq!(abi::MARKER, *abi::ABI_VERSION.as_bytes());

    let codes = match reg.get("status_codes").unwrap() {
        common::Json::Object(o) => o.clone(),
        _ => panic!("status_codes"),
    };
    assert_eq!(codes.len(), 10, "update Status when the registry adds codes");
    for (name, code) in codes {
        let status = Status::from_code(code.as_i128().unwrap() as u32);
        assert_eq!(status.name(), Some(name.as_str()));
        assert_eq!(status.class(), name.to_lowercase());
    }

    let functions = reg.get("functions").unwrap().as_array().unwrap();
    assert_eq!(functions.len(), abi::HOST_FUNCTIONS.len());
    for f in functions {
        let name = f.get("name").unwrap().as_str().unwrap();
        let ours = abi::HOST_FUNCTIONS.iter().find(|h| h.name == name).expect(name);
        assert_eq!(f.get("capability").unwrap().as_str(), Some(ours.capability), "{}", name);
        assert_eq!(f.get("max_request_bytes").unwrap().as_i128(), Some(ours.max_request_bytes as i128), "{}", name);
        assert_eq!(f.get("max_response_bytes").unwrap().as_i128(), Some(ours.max_response_bytes as i128), "{}", name);
        assert_eq!(f.get("since").unwrap().as_str(), Some(ours.since), "{}", name);
    }
}

#[test]
fn unknown_status_codes_survive() {
    let s = Status::from_code(4242);
    assert_eq!(s.code(), 4242);
    assert!(!s.is_known());
    assert_eq!(s.name(), None);
    assert_eq!(s.class(), "error");
    assert_eq!(Status::from_return(-5), Err(Status::QUOTA_EXCEEDED));
    assert_eq!(Status::from_return(7), Ok(7));
    assert_eq!(Status::from_return(i32::MIN), Err(Status::from_code(1 << 31)));
    assert_eq!(format!("{:?}", Status::DENIED), "DENIED");
    assert_eq!(format!("{:?}", s), "Status(4242)");
}
