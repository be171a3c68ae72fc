"""``pcsd-data`` (``pcsd.data``) against local HTTP servers on 127.0.0.1 serving small fixture files
(``tests/data_servers.py``): a download, a resume after a cut, a corrupt or truncated file, a 404,
no network, ``--from`` (and a missing ``--from`` folder), the shipped manifests' real counts; and
``model.path`` given as a Hugging Face model id (through the real huggingface_hub against a local
Hub). Nothing here touches the internet."""

from __future__ import annotations

import io
import json
import shutil
import socket
import sys
import zipfile
from pathlib import Path

import pytest
from data_servers import FakeHub, FileServer

from pcsd.data.cli import main as data_main
from pcsd.envs.procedural import TASK_TYPES, generate_game_json

REPO = Path(__file__).resolve().parents[1]
COUNTS = {"train": 3, "valid_seen": 2, "valid_unseen": 1}
ARCHIVE = "json_2.1.2_tw-pddl.zip"


# ----------------------------------------------------------------------------- fixtures
def alfworld_zip(counts=COUNTS) -> bytes:
    """A json_2.1.2_tw-pddl.zip of real (generated) games in the release's layout."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("json_2.1.1/", "")
        i = 0
        for split, n in counts.items():
            for _ in range(n):
                tt = TASK_TYPES[i % len(TASK_TYPES)]
                zf.writestr(
                    f"json_2.1.1/{split}/{tt}-Obj-None-Recep-{i}/trial_T{i:05d}/game.tw-pddl", generate_game_json(tt, i)
                )
                zf.writestr(f"json_2.1.1/{split}/{tt}-Obj-None-Recep-{i}/trial_T{i:05d}/traj_data.json", "{}")
                i += 1
    return buf.getvalue()


def manifest(tmp: Path, source: str, **extra) -> Path:
    shipped = json.loads((REPO / "pcsd" / "data" / "manifests" / f"{source}.json").read_text())
    shipped.update(extra)
    p = tmp / f"{source}-manifest.json"
    p.write_text(json.dumps(shipped))
    return p


def run_cli(args, capsys) -> tuple[int, str, str]:
    rc = data_main([str(a) for a in args])
    out, err = capsys.readouterr()
    return rc, out, err


def one_line(err: str) -> str:
    """The error: one line, the last one (progress lines may come before it), no traceback."""
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("error: ")]
    assert len(errors) == 1 and lines[-1] == errors[0] and "Traceback" not in err, err
    return errors[0]


@pytest.fixture()
def alf(tmp_path, monkeypatch):
    """A mirror serving the fixture archive, and a manifest with the fixture's counts."""
    with FileServer({ARCHIVE: alfworld_zip()}) as srv:
        monkeypatch.setenv("PCSD_ALFWORLD_URL", srv.url)
        yield srv, manifest(tmp_path, "alfworld", splits=COUNTS)


# ----------------------------------------------------------------------------- alfworld
def test_alfworld_downloads_checks_installs_and_prints_the_variable(alf, tmp_path, capsys):
    from pcsd.envs.alfworld import AlfworldGame
    from pcsd.eval.games import split_games

    srv, man = alf
    dest = tmp_path / "alf"
    rc, out, err = run_cli(["alfworld", "--dest", dest, "--manifest", man], capsys)
    assert rc == 0, err
    assert out.strip().splitlines()[-1] == f"export ALFWORLD_DATA={dest.resolve()}"
    for split, n in COUNTS.items():  # counted as the trainer counts them
        games = split_games(split, dest)
        assert len(games) == n
        AlfworldGame.from_file(games[0]).reset()
    assert not (dest / ".pcsd-partial").exists() and not list(dest.glob(".pcsd-staging*"))
    assert not list(dest.rglob("traj_data.json"))  # the game files only
    # a second run finds the install complete and downloads nothing
    srv.log.clear()
    rc, out, _ = run_cli(["alfworld", "--dest", dest, "--manifest", man], capsys)
    assert rc == 0 and srv.log == [] and "export ALFWORLD_DATA" in out


def test_the_printed_line_is_quoted_for_the_shell(alf, tmp_path, capsys):
    """A destination with spaces prints a line a shell reads as one assignment (issue 30, part 4)."""
    import shlex
    import subprocess

    srv, man = alf
    dest = tmp_path / "my data" / "alf world"
    rc, out, err = run_cli(["alfworld", "--dest", dest, "--manifest", man], capsys)
    assert rc == 0, err
    line = out.strip().splitlines()[-1]
    assert line == f"export ALFWORLD_DATA={shlex.quote(str(dest.resolve()))}" and "'" in line
    got = subprocess.run(["bash", "-c", f'{line}; printf %s "$ALFWORLD_DATA"'], capture_output=True, text=True)
    assert got.stdout == str(dest.resolve())


def test_alfworld_default_destination_is_alfworld_data(alf, tmp_path, capsys, monkeypatch):
    _, man = alf
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path / "env-dest"))
    rc, out, _ = run_cli(["alfworld", "--manifest", man], capsys)
    assert rc == 0 and (tmp_path / "env-dest" / "json_2.1.1" / "valid_seen").is_dir()


def test_a_cut_connection_is_resumed_with_a_range_request(alf, tmp_path, capsys):
    srv, man = alf
    size = len(srv.files[ARCHIVE])
    srv.cut[ARCHIVE] = (2, size // 3)  # the first two answers stop a third of the way in
    rc, _, err = run_cli(["alfworld", "--dest", tmp_path / "d", "--manifest", man], capsys)
    assert rc == 0, err
    ranges = [r for m, name, r in srv.log if name == ARCHIVE]
    assert ranges[0] is None and ranges[1] == f"bytes={size // 3}-" and len(ranges) == 3


def test_a_partial_download_of_an_earlier_run_is_resumed(alf, tmp_path, capsys):
    srv, man = alf
    dest = tmp_path / "d"
    part = dest / ".pcsd-partial" / f"{ARCHIVE}.part"
    part.parent.mkdir(parents=True)
    part.write_bytes(srv.files[ARCHIVE][:1000])
    rc, _, err = run_cli(["alfworld", "--dest", dest, "--manifest", man], capsys)
    assert rc == 0, err
    assert [r for _, n, r in srv.log if n == ARCHIVE] == ["bytes=1000-"]


def test_too_many_cuts_keep_the_bytes_and_say_run_again(alf, tmp_path, capsys):
    srv, man = alf
    srv.cut[ARCHIVE] = (100, 10)
    rc, _, err = run_cli(["alfworld", "--dest", tmp_path / "d", "--manifest", man], capsys)
    line = one_line(err)
    assert rc == 1 and "cut" in line and "run again to resume" in line
    assert (tmp_path / "d" / ".pcsd-partial" / f"{ARCHIVE}.part").stat().st_size > 0


def test_a_server_that_ignores_ranges_sends_the_whole_file_again(alf, tmp_path, capsys):
    srv, man = alf
    srv.ranges(False)
    srv.cut[ARCHIVE] = (1, 500)
    rc, _, err = run_cli(["alfworld", "--dest", tmp_path / "d", "--manifest", man], capsys)
    assert rc == 0, err


def test_a_corrupt_archive_is_refused_and_deleted(alf, tmp_path, capsys):
    srv, man = alf
    data = bytearray(srv.files[ARCHIVE])
    mid = len(data) // 2
    data[mid : mid + 64] = bytes(64)  # damaged inside a member: its CRC no longer matches
    srv.files[ARCHIVE] = bytes(data)
    dest = tmp_path / "d"
    rc, _, err = run_cli(["alfworld", "--dest", dest, "--manifest", man], capsys)
    line = one_line(err)
    assert rc == 1 and "damaged" in line and "run again" in line
    assert not (dest / "json_2.1.1").exists()
    assert not (dest / ".pcsd-partial" / f"{ARCHIVE}.part").exists()


def test_a_truncated_archive_is_refused(alf, tmp_path, capsys):
    srv, man = alf
    srv.files[ARCHIVE] = srv.files[ARCHIVE][: len(srv.files[ARCHIVE]) // 2]  # served whole, but half a zip
    rc, _, err = run_cli(["alfworld", "--dest", tmp_path / "d", "--manifest", man], capsys)
    assert rc == 1 and "not a whole zip archive" in one_line(err)


def test_the_wrong_number_of_games_is_refused(tmp_path, capsys, monkeypatch):
    with FileServer({ARCHIVE: alfworld_zip({"train": 2, "valid_seen": 2, "valid_unseen": 1})}) as srv:
        monkeypatch.setenv("PCSD_ALFWORLD_URL", srv.url)
        rc, _, err = run_cli(
            ["alfworld", "--dest", tmp_path / "d", "--manifest", manifest(tmp_path, "alfworld", splits=COUNTS)], capsys
        )
    assert rc == 1 and "train 2 (expected 3)" in one_line(err)


@pytest.mark.parametrize("key", ["pddl_domain", "pddl_problem", "grammar"])
def test_a_game_file_without_its_keys_is_refused(tmp_path, capsys, monkeypatch, key):
    """Valid JSON that is not a game (one of the three keys the engine needs is missing): refused,
    nothing installed (issue 30, part 4: the check had no test)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(alfworld_zip())) as src, zipfile.ZipFile(buf, "w") as dst:
        for info in src.infolist():
            data = src.read(info)
            if info.filename.endswith("game.tw-pddl") and "/valid_seen/" in info.filename:
                game = json.loads(data)
                del game[key]
                data = json.dumps(game).encode()
            dst.writestr(info, data)
    with FileServer({ARCHIVE: buf.getvalue()}) as srv:
        monkeypatch.setenv("PCSD_ALFWORLD_URL", srv.url)
        rc, _, err = run_cli(
            ["alfworld", "--dest", tmp_path / "d", "--manifest", manifest(tmp_path, "alfworld", splits=COUNTS)], capsys
        )
    line = one_line(err)
    assert rc == 1 and "is not a game file (expected the keys pddl_domain, pddl_problem, grammar)" in line
    assert not (tmp_path / "d" / "json_2.1.1").exists()


def test_a_404_is_one_line(tmp_path, capsys, monkeypatch):
    with FileServer({}) as srv:
        monkeypatch.setenv("PCSD_ALFWORLD_URL", srv.url)
        rc, _, err = run_cli(["alfworld", "--dest", tmp_path / "d"], capsys)
    line = one_line(err)
    assert rc == 1 and "404" in line and f"{srv.url}/{ARCHIVE}" in line


def test_an_html_page_instead_of_the_file_is_refused(alf, tmp_path, capsys):
    srv, man = alf
    srv.html.add(ARCHIVE)
    rc, _, err = run_cli(["alfworld", "--dest", tmp_path / "d", "--manifest", man], capsys)
    assert rc == 1 and "HTML page" in one_line(err)


def test_without_network_it_names_what_it_tried(tmp_path, capsys, monkeypatch):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("PCSD_ALFWORLD_URL", f"http://127.0.0.1:{port}/mirror")
    rc, _, err = run_cli(["alfworld", "--dest", tmp_path / "d"], capsys)
    line = one_line(err)
    assert rc == 1 and f"could not reach http://127.0.0.1:{port}/mirror/{ARCHIVE}" in line and "--from" in line


def test_from_a_local_archive_or_tree(alf, tmp_path, capsys):
    srv, man = alf
    local = tmp_path / "usb"
    local.mkdir()
    (local / ARCHIVE).write_bytes(srv.files[ARCHIVE])
    rc, out, err = run_cli(["alfworld", "--from", local, "--dest", tmp_path / "a", "--manifest", man], capsys)
    assert rc == 0, err
    # another machine's $ALFWORLD_DATA (an extracted tree) installs the same way
    rc, out, err = run_cli(["alfworld", "--from", tmp_path / "a", "--dest", tmp_path / "b", "--manifest", man], capsys)
    assert rc == 0, err
    assert srv.log == []  # nothing downloaded
    a = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("game.tw-pddl"))
    assert a == sorted(p.relative_to(tmp_path / "b") for p in (tmp_path / "b").rglob("game.tw-pddl"))


def test_a_missing_from_folder_is_one_line(tmp_path, capsys):
    for source in ("alfworld", "webshop"):
        rc, _, err = run_cli([source, "--from", tmp_path / "nowhere", "--dest", tmp_path / "d"], capsys)
        assert rc == 1 and f"--from {tmp_path / 'nowhere'}: no such folder" in one_line(err)
    rc, _, err = run_cli(["model", "org/m", "--from", tmp_path / "nowhere", "--dest", tmp_path / "m"], capsys)
    assert rc == 1 and "no such folder" in one_line(err)


def test_an_incomplete_install_is_not_replaced_without_force(alf, tmp_path, capsys):
    _, man = alf
    dest = tmp_path / "d"
    (dest / "json_2.1.1" / "train").mkdir(parents=True)
    rc, _, err = run_cli(["alfworld", "--dest", dest, "--manifest", man], capsys)
    assert rc == 1 and "--force" in one_line(err)
    rc, _, err = run_cli(["alfworld", "--dest", dest, "--manifest", man, "--force"], capsys)
    assert rc == 0, err


def test_a_bad_manifest_is_one_line(tmp_path, capsys):
    bad = tmp_path / "m.json"
    bad.write_text('{"source": "webshop", "files": []}')
    rc, _, err = run_cli(["alfworld", "--dest", tmp_path / "d", "--manifest", bad], capsys)
    assert rc == 1 and '"source": "alfworld"' in one_line(err)


def test_the_shipped_manifests_hold_the_real_counts():
    from pcsd.data.fetch import load_manifest

    alf = load_manifest("alfworld")
    assert alf.extra["splits"] == {"train": 3553, "valid_seen": 140, "valid_unseen": 134}
    assert alf.file(ARCHIVE)["url"] == "https://github.com/alfworld/alfworld/releases/download/0.4.0/" + ARCHIVE
    ws = load_manifest("webshop")
    assert ws.file("items_shuffle_1000.json")["count"] == 1000
    assert ws.file("items_shuffle.json")["count"] == 1_181_436
    assert ws.extra["sets"]["small"]["files"] == [
        "items_shuffle_1000.json",
        "items_ins_v2_1000.json",
        "items_human_ins.json",
    ]
    for f in ws.files.values():  # the original sources: WebShop's Google Drive files, spaCy's release
        assert f["url"].startswith(("https://drive.usercontent.google.com/", "https://github.com/explosion/"))


# ----------------------------------------------------------------------------- webshop
def webshop_files(n: int = 6) -> dict[str, bytes]:
    """A tiny catalogue in the original's format (products, attributes, human instructions)."""
    products, attrs = [], {}
    for i in range(n):
        asin = f"B0TEST{i:04d}"
        products.append(
            {
                "asin": asin,
                "name": f"Red Cotton Shirt Model {i}",
                "full_description": "A soft cotton shirt.",
                "small_description": ["machine wash", "cotton"],
                "pricing": f"${10 + i}.99",
                "category": "fashion",
                "query": "shirts",
                "product_category": "Clothing › Men › Shirts",
                "images": [],
                "page": 1,
                "average_rating": 4.5,
                "customization_options": {
                    "Size": [{"value": "Small", "image": None}, {"value": "Large", "image": None}]
                },
            }
        )
        attrs[asin] = {
            "attributes": ["machine wash"],
            "instruction": f"i need a red cotton shirt number {i}",
            "instruction_attributes": ["machine wash"],
        }
    human = {
        products[0]["asin"]: [
            {
                "instruction": "a red shirt please",
                "instruction_attributes": ["machine wash"],
                "instruction_options": ["small"],
            }
        ]
    }
    return {
        "items_shuffle_1000.json": json.dumps(products).encode(),
        "items_ins_v2_1000.json": json.dumps(attrs).encode(),
        "items_human_ins.json": json.dumps(human).encode(),
    }


def spacy_wheel(tmp: Path) -> bytes:
    """A real spaCy pipeline packed as the en_core_web_sm wheel is packed: an attribute ruler that
    tags every alphabetic token NOUN (no trained model needed)."""
    spacy = pytest.importorskip("spacy", reason="the noun table is built with spaCy (pcsd[webshop])")
    nlp = spacy.blank("en")
    ruler = nlp.add_pipe("attribute_ruler")
    ruler.add([[{"IS_ALPHA": True}]], {"POS": "NOUN"})
    nlp.meta.update(name="core_web_sm", version="3.8.0")
    pipe = tmp / "wheel" / "en_core_web_sm" / "en_core_web_sm-3.8.0"
    pipe.parent.mkdir(parents=True)
    nlp.to_disk(pipe)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("en_core_web_sm/__init__.py", "")
        for p in pipe.rglob("*"):
            if p.is_file():
                zf.write(p, p.relative_to(tmp / "wheel").as_posix())
    return buf.getvalue()


WHEEL = "en_core_web_sm-3.8.0-py3-none-any.whl"


@pytest.fixture()
def shop_server(tmp_path, monkeypatch):
    files = webshop_files()
    files[WHEEL] = spacy_wheel(tmp_path)
    with FileServer(files) as srv:
        monkeypatch.setenv("PCSD_WEBSHOP_URL", srv.url)
        man = json.loads((REPO / "pcsd" / "data" / "manifests" / "webshop.json").read_text())
        for f in man["files"]:
            if f["name"] == "items_shuffle_1000.json":
                f["count"] = 6
            if f["name"] == "items_ins_v2_1000.json":
                f["count"] = 6
        p = tmp_path / "webshop-manifest.json"
        p.write_text(json.dumps(man))
        yield srv, p


def test_webshop_installs_the_catalogue_and_its_noun_table(shop_server, tmp_path, capsys, monkeypatch):
    from pcsd.envs.webshop import WebShop, run_expert

    monkeypatch.delenv("WEBSHOP_CACHE", raising=False)  # the cache goes beside the data
    srv, man = shop_server
    dest = tmp_path / "ws"
    rc, out, err = run_cli(["webshop", "--dest", dest, "--manifest", man], capsys)
    assert rc == 0, err
    assert out.strip().splitlines()[-1] == f"export WEBSHOP_DATA={dest.resolve()}"
    table = json.loads((dest / "data" / "spacy_nouns_1k.json").read_text())
    assert table["by_name"]["Red Cotton Shirt Model 3"]["nouns"] == ["red", "cotton", "shirt", "model"]
    assert not (dest / "data" / ".spacy").exists()
    # the install built the index cache beside the data; the first load maps it
    assert "webshop: index cache of 6 products built" in err
    shop = WebShop.load(dest, goals="synthetic", seed=0)  # the engine reads the install as it is
    assert shop.num_products == 6 and shop.num_goals == 12
    assert shop.cache_hit and shop.cache_path is not None and Path(shop.cache_path).parent == dest / "data"
    rc, out, err = run_cli(["webshop", "--dest", dest, "--manifest", man], capsys)  # again: only checked
    assert rc == 0 and "webshop: index cache of 6 products checked" in err, err
    actions, reward, won = run_expert(shop.env(), 0)  # a purchase: the reward reads the noun table
    assert won and reward == 1.0
    assert WebShop.load(dest, goals="human").num_goals == 1


def test_webshop_from_a_local_copy_with_a_noun_table(shop_server, tmp_path, capsys):
    srv, man = shop_server
    rc, _, err = run_cli(["webshop", "--dest", tmp_path / "a", "--manifest", man], capsys)
    assert rc == 0, err
    srv.log.clear()
    rc, out, err = run_cli(["webshop", "--from", tmp_path / "a", "--dest", tmp_path / "b", "--manifest", man], capsys)
    assert rc == 0, err
    assert srv.log == []  # the files, and the noun table beside them, came from the copy
    assert (tmp_path / "b" / "data" / "spacy_nouns_1k.json").read_bytes() == (
        tmp_path / "a" / "data" / "spacy_nouns_1k.json"
    ).read_bytes()


def test_webshop_nouns_file_must_cover_every_name(shop_server, tmp_path, capsys):
    _, man = shop_server
    table = tmp_path / "nouns.json"
    table.write_text(json.dumps({"by_name": {"Red Cotton Shirt Model 0": {"nouns": ["shirt"]}}}))
    rc, _, err = run_cli(["webshop", "--dest", tmp_path / "d", "--manifest", man, "--nouns", table], capsys)
    assert rc == 1 and "no nouns for 5 of the 6 product names" in one_line(err)
    rc, _, err = run_cli(["webshop", "--dest", tmp_path / "d", "--nouns", tmp_path / "none.json"], capsys)
    assert rc == 1 and "--nouns" in one_line(err)


def test_webshop_wrong_product_count_and_unparsable_file(shop_server, tmp_path, capsys):
    srv, man = shop_server
    good = srv.files["items_shuffle_1000.json"]
    srv.files["items_shuffle_1000.json"] = json.dumps(json.loads(good)[:5]).encode()
    rc, _, err = run_cli(["webshop", "--dest", tmp_path / "d", "--manifest", man], capsys)
    assert rc == 1 and "holds 5 products, expected 6" in one_line(err)
    srv.files["items_shuffle_1000.json"] = good[:-40]  # truncated: no longer parses
    rc, _, err = run_cli(["webshop", "--dest", tmp_path / "d", "--manifest", man], capsys)
    assert rc == 1 and "does not parse" in one_line(err)
    assert not (tmp_path / "d" / "data").exists()


def test_webshop_without_spacy_says_how_to_get_it(shop_server, tmp_path, capsys, monkeypatch):
    _, man = shop_server
    monkeypatch.setitem(sys.modules, "spacy", None)  # import spacy fails, as where it is not installed
    rc, _, err = run_cli(["webshop", "--dest", tmp_path / "d", "--manifest", man], capsys)
    assert rc == 1 and "pip install 'pcsd[webshop]'" in one_line(err)


# ----------------------------------------------------------------------------- models
@pytest.fixture(scope="module")
def tiny_repo(tmp_path_factory) -> Path:
    from pcsd.tiny_model import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("repo") / "tiny", hidden_size=32, num_layers=1, num_heads=1)


@pytest.fixture()
def hub(tiny_repo, tmp_path, monkeypatch):
    with FakeHub({"pcsd-test/tiny": tiny_repo}) as h:
        monkeypatch.setenv("HF_ENDPOINT", h.url)
        monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
        yield h


def test_model_into_a_folder_through_huggingface_hub(hub, tiny_repo, tmp_path, capsys):
    import torch

    from pcsd.models import load_model

    dest = tmp_path / "models" / "tiny"
    rc, out, err = run_cli(["model", "pcsd-test/tiny", "--dest", dest], capsys)
    assert rc == 0, err
    assert out.strip().splitlines()[-1] == f"model.path={dest.resolve()}"
    for f in ("config.json", "tokenizer.json", "model.safetensors"):
        assert (dest / f).read_bytes() == (tiny_repo / f).read_bytes()
    assert not (dest / ".cache").exists() and not dest.with_name("tiny.partial").exists()
    assert load_model(dest, torch.device("cpu")).config.hidden_size == 32


def test_model_with_a_wrong_checksum_is_refused(hub, tiny_repo, tmp_path, capsys):
    data = bytearray((tiny_repo / "model.safetensors").read_bytes())
    data[-1] ^= 0xFF  # same size, other bytes than the published SHA-256 is of
    hub.corrupt[("pcsd-test/tiny", "model.safetensors")] = bytes(data)
    rc, _, err = run_cli(["model", "pcsd-test/tiny", "--dest", tmp_path / "m"], capsys)
    assert rc == 1 and "SHA-256" in one_line(err) and not (tmp_path / "m").exists()


def test_model_unknown_id_and_no_network(hub, tmp_path, capsys, monkeypatch):
    rc, _, err = run_cli(["model", "pcsd-test/nothing", "--dest", tmp_path / "m"], capsys)
    assert rc == 1 and "has no model pcsd-test/nothing" in one_line(err)
    rc, _, err = run_cli(["model", "not an id", "--dest", tmp_path / "m"], capsys)
    assert rc == 1 and "not a Hugging Face model id" in one_line(err)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    rc, _, err = run_cli(["model", "pcsd-test/tiny", "--dest", tmp_path / "m"], capsys)
    assert rc == 1 and f"could not reach http://127.0.0.1:{port}" in one_line(err)


def test_model_from_a_local_folder(tiny_repo, tmp_path, capsys):
    rc, out, err = run_cli(["model", "Qwen/Qwen2.5-3B-Instruct", "--from", tiny_repo, "--dest", tmp_path / "m"], capsys)
    assert rc == 0, err
    assert (tmp_path / "m" / "model.safetensors").read_bytes() == (tiny_repo / "model.safetensors").read_bytes()
    broken = tmp_path / "broken"
    shutil.copytree(tiny_repo, broken)
    with open(broken / "model.safetensors", "r+b") as f:
        f.truncate((broken / "model.safetensors").stat().st_size - 100)
    rc, _, err = run_cli(["model", "x/y", "--from", broken, "--dest", tmp_path / "m2"], capsys)
    assert rc == 1 and "truncated" in one_line(err)
    (broken / "tokenizer.json").unlink()
    rc, _, err = run_cli(["model", "x/y", "--from", broken, "--dest", tmp_path / "m3"], capsys)
    assert rc == 1 and "tokenizer.json" in one_line(err)


def test_model_path_takes_a_model_id_cache_and_offline(hub, tmp_path, monkeypatch):
    from pcsd.models import ModelNotFound, check_model_spec, model_config_file, resolve_model_path

    # --plan reads config.json alone: no weights are fetched
    cfg = model_config_file("pcsd-test/tiny")
    assert json.loads(cfg.read_text())["hidden_size"] == 32
    assert not any(p.endswith(".safetensors") for _, p, _ in hub.log)
    snap = resolve_model_path("pcsd-test/tiny")  # into the cache, as transformers would
    assert (snap / "model.safetensors").is_file() and str(snap).startswith(str(tmp_path / "hf-cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # offline: from the cache, no request
    hub.log.clear()
    assert resolve_model_path("pcsd-test/tiny") == snap and hub.log == []
    check_model_spec("pcsd-test/tiny")
    with pytest.raises(
        ModelNotFound,
        match=r"^model\.path=pcsd-test/other: .*not in the Hugging Face cache.*"
        r"HF_HUB_OFFLINE",
    ):
        check_model_spec("pcsd-test/other")
    with pytest.raises(ModelNotFound, match=r"^--model=pcsd-test/other: .*HF_HUB_OFFLINE"):
        resolve_model_path("pcsd-test/other", "--model")
    with pytest.raises(ModelNotFound, match=r"no such folder, and not a Hugging Face model id"):
        check_model_spec(str(tmp_path / "no" / "such" / "dir"))


def test_train_config_and_plan_take_a_model_id(hub, tmp_path, monkeypatch):
    from pcsd.train.config import ConfigError, load_config
    from pcsd.train.plan import model_shape

    cfg = load_config(["preset=alfworld-qwen2.5-3b", "model.path=pcsd-test/tiny"])
    assert model_shape(cfg).hidden == 32  # the config.json of the model id
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ConfigError, match=r"^model\.path=pcsd-test/absent: .*HF_HUB_OFFLINE"):
        load_config(["preset=alfworld-qwen2.5-3b", "model.path=pcsd-test/absent"])


def test_a_cached_model_id_is_checked_as_a_folder_is(hub, tmp_path, monkeypatch):
    """A model id already in the cache is read at config read as a folder is (the prompt budget
    against its template), and a damaged snapshot is one line naming the file when it loads."""
    import torch

    from pcsd.models import ModelLoadError, load_model, resolve_model_path
    from pcsd.train.config import ConfigError, load_config

    load_config(["model.path=pcsd-test/tiny", "rollout.max_prompt_tokens=16"])  # not cached: the load checks it
    snap = resolve_model_path("pcsd-test/tiny")
    with pytest.raises(ConfigError, match=r"^rollout\.max_prompt_tokens=16 cannot hold a single prompt"):
        load_config(["model.path=pcsd-test/tiny", "rollout.max_prompt_tokens=16"])
    weights = snap / "model.safetensors"  # a link into the cache's blobs: the blob is cut
    with open(weights, "r+b") as f:
        f.truncate(weights.stat().st_size - 100)
    with pytest.raises(ConfigError, match=f"^model.path: {weights}: truncated"):
        load_config(["model.path=pcsd-test/tiny"])
    with pytest.raises(ModelLoadError, match=f"^{weights}: truncated"):
        load_model("pcsd-test/tiny", torch.device("cpu"))


# ----------------------------------------------------------------------------- the README's commands
def readme_first_run() -> list[str]:
    text = (REPO / "README.md").read_text()
    sec = text.split("## First paper run", 1)[1].split("\n## ", 1)[0]
    block = sec.split("```bash", 1)[1].split("```", 1)[0]
    return [ln.split("#", 1)[0].strip() for ln in block.splitlines() if ln.split("#", 1)[0].strip()]


def test_the_readme_first_paper_run_commands(alf, tiny_repo, tmp_path, monkeypatch, capsys):
    """Every command of the README's "First paper run", as written, against the local servers: the
    games (a test manifest and destination appended), the model into the Hugging Face cache, then,
    offline, the memory plan and the training config on the model id, and the evaluation's arguments."""
    from pcsd.eval.cli import _parser as eval_parser
    from pcsd.train.cli import main as train_main
    from pcsd.train.cli import resolve

    cmds = readme_first_run()
    assert cmds[0].startswith("pip install")
    assert [c.split()[:2] for c in cmds[1:3]] == [["pcsd-data", "alfworld"], ["pcsd-data", "model"]]
    _, man = alf
    rc, out, err = run_cli(cmds[1].split()[1:] + ["--dest", tmp_path / "alf", "--manifest", man], capsys)
    assert rc == 0, err
    assert out.strip().splitlines()[-1] == f"export ALFWORLD_DATA={(tmp_path / 'alf').resolve()}"
    model_id = cmds[2].split()[2]
    assert model_id == "Qwen/Qwen2.5-3B-Instruct"
    with FakeHub({model_id: tiny_repo}) as hub:  # the tiny model, served under the paper model's id
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        rc, out, err = run_cli(cmds[2].split()[1:], capsys)
        assert rc == 0, err
        assert out.strip().splitlines()[-1] == f"model.path={model_id}"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # from here on the cache alone (the hub is gone)
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path / "alf"))
    later = [c for c in cmds[3:] if not c.startswith("export ")]
    plan = next(c for c in later if "--plan" in c)
    argv = plan.split(" -m pcsd.train ", 1)[1].split()
    assert train_main(argv) == 0, capsys.readouterr().err
    out = capsys.readouterr().out  # the shape of the cached model's config.json, not the built-in 3B one
    assert f"memory plan per GPU: {model_id}, 0.0" in out and "verdict: fits" in out
    train = next(c for c in later if "pcsd.train" in c and "--plan" not in c)
    cfg = resolve(train.split(" -m pcsd.train ", 1)[1].split())  # the config read, the model id checked
    assert cfg.model.path == model_id and cfg.preset == "alfworld-qwen2.5-3b"
    ev = next(c for c in later if "pcsd.eval" in c)
    args = eval_parser().parse_args(ev.split(" -m pcsd.eval ", 1)[1].split())
    assert args.model == ["runs/<run>"] and args.protocol == "paper"
