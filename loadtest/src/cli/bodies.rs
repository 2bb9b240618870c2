//! `recload bodies`: the requests a run would send, in their wire form (the pool the workload flags generate, in
//! the envelope the target flags name), written for another load generator, and how to send them printed as JSON:
//! `{"url", "method", "headers": [[name, value]], "file", "lines", "bodies", "mean_body_bytes"}`. JSON bodies go one
//! per line (`oha -Z FILE`); a binary body (KServe v2 tensor data) may hold a newline byte, so then only the first
//! body is written (`oha -D FILE`) and `lines` is false.

use serde_json::{Value, json};

use super::output::{io_error, write_out};
use super::workload::prepare_http;
use super::{BodiesArgs, CliError};

pub(super) async fn bodies_command(args: &BodiesArgs) -> Result<(), CliError> {
    let described = write_bodies(args).await?;
    write_out(std::path::Path::new("-"), &described.to_string())
}

/// Writes the bodies to `--out` and describes how to send them.
async fn write_bodies(args: &BodiesArgs) -> Result<Value, CliError> {
    let envelope = args.target.envelope(&args.workload)?;
    let p = prepare_http(&args.target, envelope, &args.workload).await?;
    let first = p
        .prepared
        .first()
        .ok_or_else(|| CliError::Usage("--pool must be at least 1".to_owned()))?;
    let lines = p.prepared.iter().all(|r| !r.body().contains(&b'\n'));
    let mut file = Vec::new();
    if lines {
        for request in p.prepared.iter() {
            file.extend_from_slice(request.body());
            file.push(b'\n');
        }
    } else {
        file.extend_from_slice(first.body());
    }
    if let Some(dir) = args.out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(io_error(dir))?;
    }
    std::fs::write(&args.out, &file).map_err(io_error(&args.out))?;
    Ok(json!({
        "url": p.target.url_of(first),
        "method": "POST",
        "headers": first.headers(),
        "file": args.out,
        "lines": lines,
        "bodies": if lines { p.prepared.len() } else { 1 },
        "mean_body_bytes": p.workload.mean_body_bytes,
    }))
}

#[cfg(test)]
mod tests {
    use super::super::Command;
    use super::super::testing::{arg, fixture_repo, parse};
    use super::*;

    /// What `recload bodies` describes, and the file it writes, for the fixture's deepfm-int8 and `extra` flags.
    async fn bodies(extra: &[&str]) -> (Value, Vec<u8>) {
        let dir = tempfile::tempdir().expect("tempdir");
        let out = dir.path().join("bodies");
        let repo = fixture_repo();
        let mut flags = vec![
            "bodies",
            "--url",
            "http://127.0.0.1:1/p",
            "--model",
            "deepfm-int8",
            "--repository",
            arg(&repo),
            "--pool",
            "3",
            "--candidates",
            "4",
            "--out",
            arg(&out),
        ];
        flags.extend_from_slice(extra);
        let Command::Bodies(args) = parse(&flags) else {
            panic!("parsed as bodies")
        };
        let described = write_bodies(&args).await.expect("written");
        (described, std::fs::read(&out).expect("the bodies"))
    }

    #[tokio::test]
    async fn json_bodies_go_one_per_line_and_a_binary_body_alone() {
        let (described, file) = bodies(&["--body", "columnar"]).await;
        assert_eq!(
            described["url"],
            "http://127.0.0.1:1/p/v1/models/deepfm-int8/rank"
        );
        assert_eq!(
            described["headers"],
            json!([["content-type", "application/json"]])
        );
        assert_eq!(
            (&described["lines"], &described["bodies"]),
            (&json!(true), &json!(3))
        );
        let lines: Vec<&[u8]> = file
            .split(|&b| b == b'\n')
            .filter(|l| !l.is_empty())
            .collect();
        assert_eq!(lines.len(), 3);
        for line in lines {
            let body = crate::workload::RankBody::parse(line).expect("a rank body");
            assert_eq!(body.candidates, 4);
            let value: Value = serde_json::from_slice(line).expect("JSON");
            assert!(value["candidates"].is_object(), "columnar: {value}");
        }

        let (described, file) = bodies(&["--envelope", "kserve-v2-grouped-batched"]).await;
        assert_eq!(
            described["url"],
            "http://127.0.0.1:1/p/v2/models/deepfm-int8/infer"
        );
        assert_eq!(
            (&described["lines"], &described["bodies"]),
            (&json!(false), &json!(1))
        );
        let headers = described["headers"].as_array().expect("headers");
        assert_eq!(
            headers[0],
            json!(["content-type", "application/octet-stream"])
        );
        assert_eq!(headers[1][0], "inference-header-content-length");
        let header_len: usize = headers[1][1]
            .as_str()
            .and_then(|n| n.parse().ok())
            .expect("a length");
        let header: Value = serde_json::from_slice(&file[..header_len]).expect("the JSON header");
        // The fixture's model: 19 user fields, 13 dense features, 7 item fields (its item id field among them).
        assert_eq!(header["inputs"][0]["shape"], json!([1, 19]));
        assert_eq!(header["inputs"][2]["shape"], json!([1, 4, 7]));
        assert_eq!(file.len(), header_len + 19 * 8 + 13 * 4 + 4 * 7 * 8);
    }
}
