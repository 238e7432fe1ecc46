//! The identities a verified client certificate proves: its DNS subject alternative names and
//! its subject's common names, matched against `tls_identity` (SPEC 7.2). Only certificates the
//! TLS handshake already verified against `--tls-client-ca` reach here.

use rustls_pki_types::CertificateDer;

/// The DNS SANs and CNs of the leaf certificate (the first of the chain). An unparsable
/// certificate proves nothing.
pub(crate) fn of_chain(chain: &[CertificateDer<'_>]) -> Vec<String> {
    let Some(leaf) = chain.first() else {
        return Vec::new();
    };
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(leaf.as_ref()) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for name in &san.value.general_names {
            if let x509_parser::extensions::GeneralName::DNSName(dns) = name {
                out.push((*dns).to_owned());
            }
        }
    }
    for cn in cert.subject().iter_common_name() {
        if let Ok(cn) = cn.as_str() {
            out.push(cn.to_owned());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sans_and_the_common_name_are_identities() {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params =
            rcgen::CertificateParams::new(vec!["coordinator.holdfast.internal".into()]).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "holdfast coordinator");
        let cert = params.self_signed(&key).unwrap();
        let ids = of_chain(&[cert.der().clone()]);
        assert!(
            ids.contains(&"coordinator.holdfast.internal".to_owned()),
            "{ids:?}"
        );
        assert!(ids.contains(&"holdfast coordinator".to_owned()), "{ids:?}");
        assert!(of_chain(&[CertificateDer::from(vec![1, 2, 3])]).is_empty());
        assert!(of_chain(&[]).is_empty());
    }
}
