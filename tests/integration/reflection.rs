//! gRPC reflection is served as `v1` and as `v1alpha` (older grpcurl and grpcui builds
//! ask for `v1alpha` only): each lists the assigner's service and returns its file.

use kafka_assigner::coordinator::HandoffConfig;
use kafka_assigner::server::AssignerServer;
use tonic::transport::Channel;
use tonic_reflection::pb::{v1, v1alpha};

use crate::support::{assigner::PROMPT, next_within};

const SERVICE: &str = "kafka_assigner.v1.KafkaAssigner";

async fn channel(url: &str) -> Channel {
    Channel::from_shared(url.to_string()).expect("url").connect().await.expect("connect")
}

/// Asks one v1alpha question and returns the answer.
async fn ask_v1alpha(
    url: &str,
    request: v1alpha::server_reflection_request::MessageRequest,
) -> v1alpha::server_reflection_response::MessageResponse {
    let mut client = v1alpha::server_reflection_client::ServerReflectionClient::new(channel(url).await);
    let request = v1alpha::ServerReflectionRequest { host: String::new(), message_request: Some(request) };
    let mut answers = client
        .server_reflection_info(tokio_stream::iter([request]))
        .await
        .expect("v1alpha reflection is served")
        .into_inner();
    let answer = next_within(&mut answers, PROMPT, "a v1alpha answer").await;
    answer.expect("an answer").message_response.expect("a response")
}

/// Asks one v1 question and returns the answer.
async fn ask_v1(
    url: &str,
    request: v1::server_reflection_request::MessageRequest,
) -> v1::server_reflection_response::MessageResponse {
    let mut client = v1::server_reflection_client::ServerReflectionClient::new(channel(url).await);
    let request = v1::ServerReflectionRequest { host: String::new(), message_request: Some(request) };
    let mut answers = client
        .server_reflection_info(tokio_stream::iter([request]))
        .await
        .expect("v1 reflection is served")
        .into_inner();
    let answer = next_within(&mut answers, PROMPT, "a v1 answer").await;
    answer.expect("an answer").message_response.expect("a response")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reflection_v1_and_v1alpha_list_the_service_and_return_its_file() {
    let server = AssignerServer::start_memory(HandoffConfig::default()).await.expect("server");
    let url = server.grpc_url();

    use v1alpha::server_reflection_request::MessageRequest as AlphaRequest;
    use v1alpha::server_reflection_response::MessageResponse as AlphaResponse;
    let AlphaResponse::ListServicesResponse(list) =
        ask_v1alpha(&url, AlphaRequest::ListServices(String::new())).await
    else {
        panic!("v1alpha: not a service list")
    };
    let names: Vec<&str> = list.service.iter().map(|s| s.name.as_str()).collect();
    assert!(names.contains(&SERVICE), "v1alpha lists {names:?}");
    let AlphaResponse::FileDescriptorResponse(file) =
        ask_v1alpha(&url, AlphaRequest::FileContainingSymbol(SERVICE.into())).await
    else {
        panic!("v1alpha: no file for {SERVICE}")
    };
    assert!(!file.file_descriptor_proto.is_empty());

    use v1::server_reflection_request::MessageRequest as V1Request;
    use v1::server_reflection_response::MessageResponse as V1Response;
    let V1Response::ListServicesResponse(list) = ask_v1(&url, V1Request::ListServices(String::new())).await
    else {
        panic!("v1: not a service list")
    };
    assert!(list.service.iter().any(|s| s.name == SERVICE), "{list:?}");
    let V1Response::FileDescriptorResponse(file) =
        ask_v1(&url, V1Request::FileContainingSymbol(SERVICE.into())).await
    else {
        panic!("v1: no file for {SERVICE}")
    };
    assert!(!file.file_descriptor_proto.is_empty());
    server.stop().await;
}
