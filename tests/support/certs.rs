//! Throwaway certificates for the TLS tests, made with `openssl`.

use super::*;

/// A throwaway CA (`ca.pem`) and a certificate for 127.0.0.1 it signed (`cert.pem`,
/// `key.pem`), made with `openssl`. The certificate names no usage, so it serves as a client's
/// too.
pub fn make_certificates(dir: &Path) {
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    let san = dir.join("san.ext");
    std::fs::write(&san, "subjectAltName=IP:127.0.0.1\n").expect("write extension file");
    let steps: [Vec<&str>; 3] = [
        [
            &[
                "req",
                "-x509",
                "-days",
                "1",
                "-subj",
                "/CN=tollgate test CA",
            ][..],
            &ec[..],
        ]
        .concat(),
        [&["req", "-subj", "/CN=127.0.0.1"][..], &ec[..]].concat(),
        vec!["x509", "-req", "-days", "1", "-CAcreateserial"],
    ];
    let files: [Vec<(&str, &str)>; 3] = [
        vec![("-keyout", "ca.key"), ("-out", "ca.pem")],
        vec![("-keyout", "key.pem"), ("-out", "req.csr")],
        vec![
            ("-in", "req.csr"),
            ("-CA", "ca.pem"),
            ("-CAkey", "ca.key"),
            ("-extfile", "san.ext"),
            ("-out", "cert.pem"),
        ],
    ];
    for (args, files) in steps.iter().zip(&files) {
        let mut command = Command::new("openssl");
        command.args(args).current_dir(dir);
        for (flag, file) in files {
            command.arg(flag).arg(file);
        }
        let output = command.output().expect("run openssl");
        assert!(
            output.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

/// A client certificate (`<stem>.pem`, `<stem>.key`) for the subject alternative name `san`
/// (`DNS:name` or `IP:address`), signed by the CA [`make_certificates`] made in `dir`.
pub fn make_client_certificate(dir: &Path, stem: &str, san: &str) {
    let ext = format!("{stem}.ext");
    std::fs::write(
        dir.join(&ext),
        format!("subjectAltName={san}\nextendedKeyUsage=clientAuth\n"),
    )
    .expect("write extension file");
    let (key, csr, pem) = (
        format!("{stem}.key"),
        format!("{stem}.csr"),
        format!("{stem}.pem"),
    );
    let subject = format!("/CN={stem}");
    let steps: [Vec<&str>; 2] = [
        vec![
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-subj",
            &subject,
            "-keyout",
            &key,
            "-out",
            &csr,
        ],
        vec![
            "x509",
            "-req",
            "-days",
            "1",
            "-CAcreateserial",
            "-in",
            &csr,
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-extfile",
            &ext,
            "-out",
            &pem,
        ],
    ];
    for args in steps {
        let output = Command::new("openssl")
            .args(&args)
            .current_dir(dir)
            .output()
            .expect("run openssl");
        assert!(
            output.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
}
