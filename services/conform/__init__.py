"""Conformance suites: `kvmesh conform ROLE ENDPOINT` drives one running implementation of a
role from the outside and checks it against the clauses in docs/contracts.md.

Only `kvmesh.runtime` (stubs, block hashes, the NATS bus) may be imported here, never a service
package: the suite and its test doubles are built from the protos and the written contract.
"""
