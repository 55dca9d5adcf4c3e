"""The README's configuration table names every setting, and every variable
it names is a setting: operators configure from that table."""

import re
from pathlib import Path

from app import opscli
from app.settings import Settings

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def env_names() -> set[str]:
    return {
        "DATABASE_URL" if name == "database_url" else f"FENCEPOST_{name.upper()}"
        for name in Settings.model_fields
    }


def test_every_setting_is_in_the_readme_configuration_table():
    table = README.split("### Configuration", 1)[1].split("\n## ", 1)[0]
    missing = sorted(n for n in env_names() if f"`{n}`" not in table)
    assert not missing, f"README configuration table lacks {missing}"


def test_every_variable_the_readme_names_exists():
    named = set(re.findall(r"`((?:FENCEPOST_[A-Z_]+)|DATABASE_URL)`", README))
    # The operator CLI's own variables: where it finds the API, not settings.
    client = {opscli.URL_VARIABLE, opscli.TOKEN_VARIABLE}
    unknown = sorted(named - env_names() - client)
    assert not unknown, f"README names variables that are not settings: {unknown}"
