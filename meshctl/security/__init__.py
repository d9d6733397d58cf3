"""Security: workload identity, the mesh's certificate authority, mutual TLS policy.

    identity.py             WorkloadIdentity: spiffe://TRUST_DOMAIN/ns/NAMESPACE/sa/SERVICE_ACCOUNT
    ca.py                   CertificateAuthority: issues workload, VM client and xDS server certificates
    cacerts.py              a plug-in CA in Istio's cacerts layout, and the checks every CA passes
    selfsigned.py           meshctl's own root, made once under the state directory and kept
    pem.py                  PEM files in and out, with errors that name the file
    files.py                writing key and certificate files atomically
    peer_authentication.py  which mutual TLS mode applies to a workload's port (PeerAuthentication)
    authorization.py        which AuthorizationPolicies select a workload, and their actions
    request_authentication.py  which JWT rules a workload validates tokens with (RequestAuthentication)

Key material never reaches a message, a log line or a `repr`: errors name files, never contents.
Nothing here reads flags or globals; the CLI and the server pass paths and settings in.

Import from the modules themselves: this package re-exports nothing, so that the generators that
read policy never load the X.509 machinery the CA needs.
"""
