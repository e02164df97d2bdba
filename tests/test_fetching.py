"""fetch() against a fake Google Drive on 127.0.0.1, through the installed gdown (5.x or 6.x).

Every request gdown (or fetch itself) makes to a Google host is sent to a local HTTP server instead,
by wrapping ``requests``' transport adapter; everything above the socket (gdown's redirects, its
confirmation-page parsing, its folder-page parsing, requests' cookie and redirect handling) runs for
real. The server answers the way Drive does as gdown reads it: ``/uc`` redirects to
``drive.usercontent.google.com/download``, big files get the virus-scan form, quota errors come as
``uc-error-subcaption``, private files redirect to a sign-in page, unknown ids get 404, and folders
are served both as gdown 6's ``embeddedfolderview`` and as gdown 5's ``_DRIVE_ivd`` page.
Run with ``PYTHONPATH=<unpacked gdown 5.2.2>`` to test Colab's gdown.
"""

from __future__ import annotations

import hashlib
import html
import io
import json
import tarfile
import threading
import urllib.parse
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests

from colabfast.staging.fetching import DriveLink, FetchError, fetch, parse_link

GOOGLE_HOSTS = {"drive.google.com", "docs.google.com", "drive.usercontent.google.com", "accounts.google.com"}
FOLDER_MIME = "application/vnd.google-apps.folder"
QUOTA = (
    "Too many users have viewed or downloaded this file recently. Please try accessing the file again "
    "later. If the file you are trying to access is particularly large or is shared with many people, it "
    "may take up to 24 hours to be able to view or download the file."
)


class FakeDrive:
    """Files and folders by id, and a log of every request ("host/path?query")."""

    def __init__(self) -> None:
        self.files: dict[str, tuple[str, bytes, str]] = {}  # id -> (name, data, state)
        self.folders: dict[str, tuple[str, list[str]]] = {}  # id -> (name, child ids)
        self.requests: list[str] = []
        self.offline = False
        self.lock = threading.Lock()

    def _new_id(self, name: str) -> str:
        n = len(self.files) + len(self.folders)
        return "1" + hashlib.sha1(f"{name}/{n}".encode()).hexdigest()[:32]  # 33 characters, like Drive's

    def add_file(self, name: str, data: bytes, state: str = "public") -> str:
        """state: "public", "confirm" (big file: virus-scan page first), "quota" or "private"."""
        file_id = self._new_id(name)
        self.files[file_id] = (name, data, state)
        return file_id

    def add_folder(self, name: str, children: list[str]) -> str:
        folder_id = self._new_id(name)
        self.folders[folder_id] = (name, children)
        return folder_id

    def count(self) -> int:
        with self.lock:
            return len(self.requests)


class Handler(BaseHTTPRequestHandler):
    drive: FakeDrive

    def log_message(self, *args) -> None:  # keep test output clean
        pass

    def do_GET(self) -> None:
        host, _, rest = self.path.lstrip("/").partition("/")
        url = urllib.parse.urlsplit("/" + rest)
        query = {k: v[0] for k, v in urllib.parse.parse_qs(url.query).items()}
        with self.drive.lock:
            self.drive.requests.append(f"{host}{url.path}?{url.query}")
        route = {
            ("drive.google.com", "/uc"): self.uc,
            ("drive.google.com", "/open"): self.uc,
            ("drive.usercontent.google.com", "/download"): self.download,
            ("drive.google.com", "/embeddedfolderview"): self.folder_view_gdown6,
        }.get((host, url.path))
        if route is not None:
            return route(query)
        if host == "drive.google.com" and url.path.startswith("/drive/folders/"):
            return self.folder_page_gdown5(url.path.rsplit("/", 1)[1])
        if host == "accounts.google.com":
            return self.send(200, "<html><head><title>Sign in - Google Accounts</title></head></html>")
        self.not_found()

    def send(self, status: int, body: str | bytes, headers: dict | None = None) -> None:
        data = body.encode() if isinstance(body, str) else body
        self.send_response(status)
        headers = headers or {"Content-Type": "text/html; charset=utf-8"}
        for key, value in {**headers, "Content-Length": str(len(data))}.items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)

    def redirect(self, location: str) -> None:
        self.send_response(303)
        self.send_header("Location", location)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def not_found(self) -> None:
        self.send(
            404,
            "<html><head><title>Google Drive - Page Not Found</title></head><body>Sorry, the file "
            "you have requested does not exist.</body></html>",
        )

    def uc(self, query: dict) -> None:
        if query.get("id") not in self.drive.files:
            return self.not_found()
        self.redirect(f"https://drive.usercontent.google.com/download?id={query['id']}&export=download")

    def download(self, query: dict) -> None:
        file_id = query.get("id")
        if file_id not in self.drive.files:
            return self.not_found()
        name, data, state = self.drive.files[file_id]
        if state == "private":
            return self.redirect("https://accounts.google.com/ServiceLogin?continue=https://drive.google.com/")
        if state == "quota":
            return self.send(
                200,
                "<html><head><title>Google Drive - Quota exceeded</title></head><body>\n"
                f'<p class="uc-error-subcaption">{QUOTA}</p>\n</body></html>',
            )
        if state == "confirm" and query.get("confirm") != "t":
            # One line, as gdown parses the page line by line.
            form = (
                f'<form id="download-form" action="https://drive.usercontent.google.com/download" '
                f'method="get"><input type="hidden" name="id" value="{file_id}"><input type="hidden" '
                f'name="export" value="download"><input type="hidden" name="confirm" value="t">'
                f'<input type="hidden" name="uuid" value="0b1d"></form>'
            )
            return self.send(
                200,
                f"<html><head><title>Google Drive - Virus scan warning</title></head><body>\n{form}\n</body></html>",
            )
        self.send(
            200,
            data,
            {
                "Content-Type": "application/octet-stream",
                "Content-Disposition": f'attachment; filename="{name}"',
            },
        )

    def children(self, folder_id: str) -> list[tuple[str, str, bool]]:
        out = []
        for child in self.drive.folders[folder_id][1]:
            if child in self.drive.folders:
                out.append((child, self.drive.folders[child][0], True))
            else:
                out.append((child, self.drive.files[child][0], False))
        return out

    def folder_view_gdown6(self, query: dict) -> None:
        folder_id = query.get("id")
        if folder_id not in self.drive.folders:
            return self.not_found()
        links = "".join(
            f'<a href="https://drive.google.com/drive/folders/{cid}">{html.escape(name)}</a>'
            if is_folder
            else f'<a href="https://drive.google.com/file/d/{cid}/view?usp=drive_web">{html.escape(name)}</a>'
            for cid, name, is_folder in self.children(folder_id)
        )
        title = html.escape(self.drive.folders[folder_id][0])
        self.send(200, f"<html><head><title>{title}</title></head><body>{links}</body></html>")

    def folder_page_gdown5(self, folder_id: str) -> None:
        if folder_id not in self.drive.folders:
            return self.not_found()
        entries = [
            [cid, [folder_id], name, FOLDER_MIME if is_folder else "application/octet-stream"]
            for cid, name, is_folder in self.children(folder_id)
        ]
        # Drive escapes the JSON for a JS string literal; gdown 5 undoes it with unicode_escape.
        encoded = json.dumps([entries]).replace("\\", "\\\\").replace('"', "\\x22").replace("'", "\\x27")
        title = html.escape(self.drive.folders[folder_id][0])
        self.send(
            200,
            f"<html><head><title>{title} - Google Drive</title></head><body>"
            f"<script>window['_DRIVE_ivd'] = '{encoded}';</script></body></html>",
        )


def _gdown_version() -> str:
    # Imported here, not at module level: `pytest -m cuda` must collect on a GPU machine without gdown.
    import gdown

    return gdown.__version__


@pytest.fixture
def drive(monkeypatch):
    """A FakeDrive that every request to a Google host reaches; other hosts are unreachable."""
    fake = FakeDrive()
    handler = type("BoundHandler", (Handler,), {"drive": fake})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{server.server_port}"
    send = requests.adapters.HTTPAdapter.send

    def send_to_fake(adapter, request, **kwargs):
        original = request.url
        parts = urllib.parse.urlsplit(original)
        if parts.hostname not in GOOGLE_HOSTS or fake.offline:
            raise requests.ConnectionError(f"no network in tests: {original}")
        request.url = f"{base}/{parts.hostname}{parts.path}" + (f"?{parts.query}" if parts.query else "")
        try:
            response = send(adapter, request, **{**kwargs, "proxies": {}})
        finally:
            request.url = original
        response.url = original  # gdown and requests see Drive's URLs, as in real use
        return response

    monkeypatch.setattr(requests.adapters.HTTPAdapter, "send", send_to_fake)
    yield fake
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


def digest(data: bytes, algo: str = "sha256") -> str:
    return f"{algo}:{hashlib.new(algo, data).hexdigest()}"


def leftovers(folder) -> list[str]:
    """Anything colabfast left in the user's folder: partial downloads, records, locks."""
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(".colabfast"))


# --- links ------------------------------------------------------------------------------------------

ID = "1AbCdEfGhIjKlMnOpQrStUvWxYz012345"


@pytest.mark.parametrize(
    "link, expected",
    [
        (ID, DriveLink(ID)),
        (f"https://drive.google.com/file/d/{ID}/view?usp=sharing", DriveLink(ID)),
        (f"https://drive.google.com/file/u/1/d/{ID}/view", DriveLink(ID)),
        (f"https://drive.google.com/open?id={ID}", DriveLink(ID)),
        (f"https://drive.google.com/uc?id={ID}&export=download", DriveLink(ID)),
        (f"https://drive.usercontent.google.com/download?id={ID}&export=download", DriveLink(ID)),
        (f"https://docs.google.com/spreadsheets/d/{ID}/edit#gid=0", DriveLink(ID)),
        (f"https://drive.google.com/drive/folders/{ID}?usp=sharing", DriveLink(ID, folder=True)),
        (f"https://drive.google.com/drive/u/0/folders/{ID}", DriveLink(ID, folder=True)),
        (f"https://drive.google.com/embeddedfolderview?id={ID}", DriveLink(ID, folder=True)),
    ],
)
def test_parse_link(link, expected):
    assert parse_link(link) == expected


@pytest.mark.parametrize("bad", ["data.zip", "https://example.com/file/d/x", "https://drive.google.com/drive/my-drive"])
def test_parse_link_refuses_what_is_not_drive(bad):
    with pytest.raises(ValueError, match="not a Google Drive link"):
        parse_link(bad)


# --- files, hashes, cache -----------------------------------------------------------------------------


def test_file_is_downloaded_under_its_drive_name(drive, tmp_path):
    data = bytes(range(256)) * 40
    file_id = drive.add_file("weights.bin", data)
    out = fetch(f"https://drive.google.com/file/d/{file_id}/view?usp=sharing", tmp_path, quiet=True)
    assert out == tmp_path / "weights.bin"
    assert out.read_bytes() == data
    assert leftovers(tmp_path) == []


def test_state_lives_in_the_cache_and_a_killed_download_is_cleared(drive, tmp_path):
    """Issue 13: nothing of colabfast's stays beside the user's files; a download killed midway
    (its temporary folder left behind) is removed by the next fetch of that link."""
    file_id = drive.add_file("a.bin", b"a" * 1000)
    (tmp_path / f".colabfast-download-{file_id}-killed").mkdir()
    (tmp_path / "notes.txt").write_text("mine")
    out = fetch(file_id, tmp_path, quiet=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.bin", "notes.txt"] and out.read_bytes() == b"a" * 1000
    n = drive.count()
    assert fetch(file_id, tmp_path, quiet=True) == out and drive.count() == n  # the record in the cache serves it


def test_big_file_goes_through_the_confirmation_page(drive, tmp_path):
    data = b"x" * 300_000
    file_id = drive.add_file("big.bin", data, state="confirm")
    out = fetch(file_id, tmp_path / "renamed.bin", quiet=True)
    assert out == tmp_path / "renamed.bin" and out.read_bytes() == data
    assert any("confirm=t" in r for r in drive.requests)


@pytest.mark.parametrize("algo", ["md5", "sha256"])
def test_hash_verified_and_second_call_is_free(drive, tmp_path, algo):
    data = b"label,path\n" * 1000
    file_id = drive.add_file("train.csv", data)
    first = fetch(file_id, tmp_path, hash=digest(data, algo), quiet=True)
    n = drive.count()
    assert n > 0 and first.read_bytes() == data
    again = fetch(file_id, tmp_path, hash=digest(data, algo).upper().replace(algo.upper(), algo), quiet=True)
    assert again == first
    assert drive.count() == n  # no HTTP request at all


def test_default_destination_is_the_cache(drive, tmp_path, monkeypatch):
    monkeypatch.setenv("COLABFAST_CACHE", str(tmp_path / "cache"))
    file_id = drive.add_file("a.txt", b"hello")
    out = fetch(file_id, quiet=True)
    assert out == tmp_path / "cache" / "fetch" / file_id / "a.txt"
    n = drive.count()
    assert fetch(file_id, quiet=True) == out and drive.count() == n


def test_wrong_hash_discards_the_download(drive, tmp_path):
    file_id = drive.add_file("model.pt", b"new weights")
    with pytest.raises(FetchError, match="sha256:") as err:
        fetch(file_id, tmp_path, hash=digest(b"old weights"), quiet=True)
    assert err.value.reason == "hash"
    assert not (tmp_path / "model.pt").exists()
    assert leftovers(tmp_path) == []


def test_changed_file_is_downloaded_again(drive, tmp_path):
    data = b"0123456789" * 100
    file_id = drive.add_file("d.bin", data)
    out = fetch(file_id, tmp_path, hash=digest(data), quiet=True)
    out.write_bytes(b"corrupted!" * 100)  # same size, new time and content
    n = drive.count()
    assert fetch(file_id, tmp_path, hash=digest(data), quiet=True).read_bytes() == data
    assert drive.count() > n


def test_file_placed_by_hand_with_the_right_hash_is_used(drive, tmp_path):
    data = b"already here"
    file_id = drive.add_file("x.bin", data)
    (tmp_path / "x.bin").write_bytes(data)
    assert fetch(file_id, tmp_path / "x.bin", hash=digest(data, "md5"), quiet=True).read_bytes() == data
    assert drive.count() == 0


@pytest.mark.parametrize("bad", ["sha256", "sha256:abc", "crc32:1234", "md5:" + "g" * 32])
def test_malformed_hash_is_refused_before_any_request(drive, tmp_path, bad):
    with pytest.raises(ValueError, match="hash="):
        fetch(ID, tmp_path, hash=bad)
    assert drive.count() == 0


# --- errors from Drive --------------------------------------------------------------------------------


def test_quota_error(drive, tmp_path):
    file_id = drive.add_file("popular.zip", b"x", state="quota")
    with pytest.raises(FetchError, match="Too many users") as err:
        fetch(file_id, tmp_path, quiet=True)
    assert err.value.reason == "quota"
    assert "colabfast.mount()" in str(err.value)


def test_private_file_is_a_permission_error(drive, tmp_path):
    file_id = drive.add_file("secret.zip", b"x", state="private")
    with pytest.raises(FetchError, match="Anyone with the link") as err:
        fetch(file_id, tmp_path, quiet=True)
    assert err.value.reason == "permission"


def test_unknown_id_is_not_found(drive, tmp_path):
    with pytest.raises(FetchError, match=f"no file with id {ID}") as err:
        fetch(ID, tmp_path, quiet=True)
    assert err.value.reason == "not_found"


def test_unknown_folder_is_not_found(drive, tmp_path):
    with pytest.raises(FetchError, match="no folder") as err:
        fetch(f"https://drive.google.com/drive/folders/{ID}", tmp_path, quiet=True)
    assert err.value.reason == "not_found"


def test_no_network(drive, tmp_path):
    drive.offline = True
    with pytest.raises(FetchError, match="could not reach Google Drive") as err:
        fetch(ID, tmp_path, quiet=True)
    assert err.value.reason == "network"
    assert leftovers(tmp_path) == []


# --- folders -----------------------------------------------------------------------------------------


def test_folder_tree_is_downloaded_once(drive, tmp_path):
    a = drive.add_file("a.txt", b"A")
    b = drive.add_file("b.bin", b"B" * 1000)
    sub = drive.add_folder("labels", [b])
    top = drive.add_folder("dataset", [a, sub])
    out = fetch(f"https://drive.google.com/drive/folders/{top}?usp=sharing", tmp_path, quiet=True)
    assert out == tmp_path / "dataset"
    assert (out / "a.txt").read_bytes() == b"A"
    assert (out / "labels" / "b.bin").read_bytes() == b"B" * 1000
    page = "embeddedfolderview" if _gdown_version().startswith("6.") else "/drive/folders/"
    assert any(page in r for r in drive.requests)  # the folder page this gdown reads
    n = drive.count()
    assert fetch(f"https://drive.google.com/drive/folders/{top}", tmp_path, quiet=True) == out
    assert drive.count() == n
    assert leftovers(tmp_path) == []


def test_folder_of_50_files(drive, tmp_path):
    files = [drive.add_file(f"{i:03d}.txt", str(i).encode()) for i in range(50)]
    top = drive.add_folder("many", files)
    link = f"https://drive.google.com/drive/folders/{top}"
    if _gdown_version().startswith("5."):  # gdown 5 cannot tell 50 files from more, and refuses
        with pytest.raises(FetchError, match="at most 50 files") as err:
            fetch(link, tmp_path, quiet=True)
        assert err.value.reason == "folder_limit"
        assert not (tmp_path / "many").exists()
    else:
        out = fetch(link, tmp_path, quiet=True)
        assert sorted(p.name for p in out.iterdir()) == [f"{i:03d}.txt" for i in range(50)]


def test_folder_never_replaces_a_folder_it_did_not_fetch(drive, tmp_path):
    top = drive.add_folder("dataset", [drive.add_file("a.txt", b"A")])
    (tmp_path / "dataset").mkdir()
    (tmp_path / "dataset" / "mine.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="did not fetch"):
        fetch(f"https://drive.google.com/drive/folders/{top}", tmp_path, quiet=True)
    assert (tmp_path / "dataset" / "mine.txt").read_text() == "keep me"


def test_hash_and_extract_are_for_files(tmp_path):
    with pytest.raises(ValueError, match="folder"):
        fetch(f"https://drive.google.com/drive/folders/{ID}", tmp_path, hash="md5:" + "0" * 32)


# --- archives ------------------------------------------------------------------------------------------


def tar_gz(entries: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for name, data in entries.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def zip_bytes(entries: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in entries.items():
            zf.writestr(name, data)
    return buf.getvalue()


def test_archive_is_extracted_once(drive, tmp_path):
    data = tar_gz({"kitti/training/000000.txt": b"Car 0 0 0", "kitti/training/000001.txt": b"Van 0 0 0"})
    file_id = drive.add_file("kitti.tar.gz", data)
    out = fetch(file_id, tmp_path, hash=digest(data), extract=True, quiet=True)
    assert (out / "training" / "000001.txt").read_bytes() == b"Van 0 0 0"
    assert out.is_relative_to(tmp_path / "kitti")
    assert (tmp_path / "kitti.tar.gz").read_bytes() == data  # the archive is kept for the cache
    n = drive.count()
    assert fetch(file_id, tmp_path, hash=digest(data), extract=True, quiet=True) == out
    assert drive.count() == n


@pytest.mark.parametrize(
    "name, data",
    [
        ("evil.tar.gz", tar_gz({"ok.txt": b"fine", "../escaped.txt": b"gotcha"})),
        ("evil.zip", zip_bytes({"ok.txt": b"fine", "../escaped.txt": b"gotcha"})),
        ("abs.zip", zip_bytes({"/tmp/escaped.txt": b"gotcha"})),
    ],
)
def test_hostile_archive_is_refused(drive, tmp_path, name, data):
    from colabfast.staging.extract import UnsafeArchiveError

    dst = tmp_path / "downloads"
    file_id = drive.add_file(name, data)
    with pytest.raises(UnsafeArchiveError):
        fetch(file_id, f"{dst}/", extract=True, quiet=True)
    assert not (tmp_path / "escaped.txt").exists() and not (dst / "escaped.txt").exists()
    stem = name.split(".")[0]
    assert not (dst / stem).exists()
    assert (dst / name).read_bytes() == data  # downloaded and verified; only extraction was refused


def test_extract_needs_an_archive(drive, tmp_path):
    file_id = drive.add_file("notes.txt", b"just text")
    with pytest.raises(ValueError, match="not an archive"):
        fetch(file_id, tmp_path, extract=True, quiet=True)
    assert (tmp_path / "notes.txt").read_bytes() == b"just text"


def test_gdown_version_is_reported():
    # Which gdown these tests ran against (Colab ships 5.2.2, PyPI has 6.x).
    assert _gdown_version().split(".")[0] in ("5", "6")
