from kvmesh.runtime import settingsdoc


def test_docs_settings_md_is_current():
    """Fails when a setting changed without `python -m kvmesh.runtime.settingsdoc`."""
    assert settingsdoc.main(["--check"]) == 0


def test_every_service_is_documented_with_its_prefix():
    text = settingsdoc.render()
    for service in settingsdoc.SERVICES:
        assert f"## {service}" in text
        assert f"`KVMESH_{service.upper()}_PORT`" in text
    assert "`KVMESH_API_KEYS`" in text
