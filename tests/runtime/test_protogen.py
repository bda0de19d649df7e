from kvmesh.runtime import protogen


def test_committed_stubs_match_the_protos():
    """Fails when a .proto changed without `make proto` (or grpcio-tools is not the pinned one)."""
    assert protogen.main(["--check"]) == 0


def test_stub_imports_are_relative():
    for name, text in protogen.generate().items():
        assert "from kvmesh.v1 import" not in text, name
