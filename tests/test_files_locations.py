"""jobs.spec.locations: one canonical location for every spelling of a files sink's directory,
and "same or nested" as a comparison of canonical directories (pure: no Django; the local
cases use a temporary directory with real symbolic links)."""

from __future__ import annotations

import pytest

from jobs.spec import SpecError, parse_spec
from jobs.spec.locations import (
    Location,
    LocationError,
    files_sinks,
    local,
    location,
    parse_root,
    relative,
)
from tests.factories import files_spec, valid_spec


def same(a: tuple[str, str], b: tuple[str, str]) -> bool:
    return location(*a) == location(*b)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        # scheme and host in any case; hdfs's default NameNode port explicit
        (("HDFS://NN:8020/a", ""), ("hdfs://nn/a/", "")),
        (("hdfs://nn/a", "x"), ("hdfs://NN:08020/a/", "x/")),
        # dot segments, repeated and trailing slashes
        (("s3a://b/x/./y", ""), ("s3a://b/x/y", "")),
        (("s3a://b/x//y/", ""), ("s3a://b/x/y", "")),
        (("s3a://b/x", "a//b/"), ("s3a://b/x", "a/b")),
        (("s3a://b/x", "q/../y"), ("s3a://b/x", "y")),
        (("s3a://b/x/q/..", "y"), ("s3a://b/x/y", "")),
        # percent-encoding decoded once
        (("hdfs://nn/lake", "%61"), ("hdfs://nn/lake", "a")),
        (("hdfs://nn/l%61ke", ""), ("hdfs://nn/lake", "")),
        # one store, several schemes: S3's connectors, Azure's blob and Data Lake endpoints
        (("s3://bucket/x", ""), ("s3a://BUCKET/x", "")),
        (("s3n://bucket:443/x", ""), ("s3a://bucket/x", "")),
        (
            ("wasbs://c@acct.blob.core.windows.net/x", ""),
            ("abfss://c@acct.dfs.core.windows.net/x", ""),
        ),
        (
            ("abfs://c@ACCT.dfs.core.windows.net/x", ""),
            ("abfss://c@acct.dfs.core.windows.net/x/", ""),
        ),
        (("gs://bucket:99/x", ""), ("gs://bucket/x", "")),
        # local: file:/x, file:///x and file://localhost/x are one
        (("file:/srv/lake", "a"), ("file:///srv/lake/", "a")),
        (("file://localhost/srv/lake", "a"), ("file:///srv/lake", "a")),
    ],
)
def test_spellings_of_one_directory_have_one_location(a, b):
    assert same(a, b)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (("hdfs://nn/a", ""), ("hdfs://nn:9000/a", "")),  # another NameNode port
        (("hdfs://nn/a", ""), ("viewfs://nn/a", "")),  # a mount table: configuration
        (("hdfs://nn/a", ""), ("hdfs://nn2/a", "")),
        (("s3a://b/x", ""), ("gs://b/x", "")),
        (
            ("wasbs://c@acct.blob.core.windows.net/x", ""),
            ("abfs://d@acct.dfs.core.windows.net/x", ""),
        ),
        (("hdfs://nn/Lake", ""), ("hdfs://nn/lake", "")),  # paths keep their case
        (("file:///srv/lake", ""), ("hdfs://nn/srv/lake", "")),
    ],
)
def test_different_places_stay_different(a, b):
    assert not location(*a).overlaps(location(*b))


def test_default_ports_are_made_explicit_and_named_stores_drop_theirs():
    assert str(location("HDFS://NN/lake/")) == "hdfs://nn:8020/lake"
    assert str(location("webhdfs://nn/lake")) == "webhdfs://nn:9870/lake"
    assert str(location("swebhdfs://nn/lake")) == "swebhdfs://nn:9871/lake"
    assert str(location("viewfs://Cluster/lake")) == "viewfs://cluster/lake"
    assert str(location("s3://B:9000/x")) == "s3a://b/x"
    assert str(location("wasbs://c@acct.blob.core.windows.net")) == (
        "abfs://c@acct.dfs.core.windows.net/"
    )
    assert str(location("file:///")) == "file:///"


def test_same_or_nested_is_a_comparison_of_whole_directories_both_ways():
    outer = location("hdfs://nn/lake", "sales")
    inner = location("HDFS://NN:8020/lake/", "sales/orders/eu")
    assert outer.contains(inner) and not inner.contains(outer)
    assert outer.overlaps(inner) and inner.overlaps(outer)
    assert outer.overlaps(outer) and outer.contains(outer)
    # A shared prefix of letters is not nesting.
    beside = location("hdfs://nn/lake", "sales-eu")
    assert not outer.overlaps(beside) and not beside.overlaps(outer)
    # The root and a path under another connection's deeper root meet in the middle.
    assert location("s3a://b/lake", "sales/orders") == location("s3a://b/lake/sales", "orders")


@pytest.mark.parametrize(
    ("root", "path", "message"),
    [
        ("hdfs://nn/lake", "a%2Fb", "encodes a '/'"),
        ("hdfs://nn/lake", "a%2fb", "encodes a '/'"),
        ("hdfs://nn/lake/%2E%2E", "", "encodes '..'"),
        ("hdfs://nn/lake", "%2e", "encodes '.'"),
        ("hdfs://nn/lake", "%2561", "encoded twice"),
        ("hdfs://nn/lake", "a%zz", "stray '%'"),
        ("hdfs://nn/lake", "%ff", "not percent-encoded UTF-8"),
        ("hdfs://nn/lake", "%00", "control characters"),
        ("hdfs://nn/lake", "..", "climbs above the root it is under"),
        ("hdfs://nn/lake", "a/../../b", "climbs above the root it is under"),
        ("hdfs://nn/..", "", "climbs above the top of the file system"),
        ("file:///..", "", "climbs above the top of the file system"),
        ("hdfs://nn/lake", "/abs", "is not relative"),
        ("hdfs://nn/lake", "s3a://b/x", "is not relative"),
        ("hdfs:///lake", "", "names no host"),
        ("hdfs://user:secret@nn/lake", "", "carries credentials"),
        ("hdfs://nn:99999/lake", "", "is not host[:port]"),
        ("hdfs://n%6E/lake", "", "percent-encoded"),
        ("file://otherhost/srv", "", "names no host"),
        ("ftp://h/x", "", "is not a file system"),
        ("lake", "", "is not a URI"),
        ("hdfs://nn/lake?x=1", "", "?query"),
        ("hdfs://nn/la ke", "", "spaces"),
    ],
)
def test_ambiguous_or_escaping_spellings_are_refused(root, path, message):
    with pytest.raises(LocationError) as caught:
        location(root, path)
    assert message in str(caught.value)


def test_relative_paths_are_canonical_directories():
    assert relative("a//b/") == ("a", "b")
    assert relative("./x/../y") == ("y",)
    assert relative("%61") == ("a",)
    assert relative("") == ()
    with pytest.raises(LocationError):
        relative("x/../..")


def test_local_paths_follow_symbolic_links_where_they_exist(tmp_path):
    real = tmp_path / "real"
    (real / "sales").mkdir(parents=True)
    (tmp_path / "alias").symlink_to(real)
    (real / "mirror").symlink_to(real / "sales")
    # A root through a link, a path through a link, a tail that does not exist yet.
    assert location(f"file://{tmp_path}/alias", "sales") == location(f"file://{real}", "sales")
    assert location(f"file://{real}", "mirror") == location(f"file://{real}", "sales")
    assert location(f"file://{real}", "mirror/eu/new") == location(f"file://{real}/sales/eu/new")
    assert location(f"file://{tmp_path}/alias", "x").contains(location(f"file://{real}/x", "y"))
    assert local(tmp_path / "alias" / "sales") == location(f"file://{real}/sales")
    # Dot segments are resolved as Hadoop's Path does, by the text (before the links).
    assert location(f"file://{real}", "mirror/..") == location(f"file://{real}")
    # Without realpath (what a job on another host sees): the text only.
    assert parse_root(f"file://{tmp_path}/alias", realpath=None) != parse_root(f"file://{real}")


def test_the_file_system_is_asked_only_through_realpath():
    links = {"/srv/lake/alias": "/srv/other"}

    def fake_realpath(path: str) -> str:
        for link, target in links.items():
            if path == link or path.startswith(link + "/"):
                return target + path[len(link) :]
        return path

    here = location("file:///srv/lake", "alias/x", realpath=fake_realpath)
    assert here == Location("file", "", ("srv", "other", "x"))
    assert local("/srv/lake/alias", realpath=fake_realpath) == location("file:///srv/other")
    with pytest.raises(LocationError):
        local("relative/path")


def test_files_sinks_of_a_stored_spec_are_named_as_the_api_names_them():
    one = files_spec("a/b")
    assert files_sinks(one) == [("sink.path", one["sink"])]
    two = valid_spec(sinks=[valid_spec()["sink"], files_spec("x")["sink"]])
    two.pop("sink")
    assert files_sinks(two) == [("sinks[1].path", files_spec("x")["sink"])]
    assert files_sinks(None) == [] and files_sinks({"sink": "nonsense"}) == []


# -- within one spec: jobs.spec.validate goes through the same comparison ---------------------

CONNECTIONS = {"events": "kafka", "warehouse": "postgres", "lake": "files"}


def two_files_sinks(a: str, b: str) -> dict:
    spec = valid_spec(sinks=[files_spec(a)["sink"], files_spec(b)["sink"]])
    spec.pop("sink")
    return spec


def errors_of(spec: dict) -> dict[str, list[str]]:
    with pytest.raises(SpecError) as caught:
        parse_spec(spec, connections=CONNECTIONS)
    return caught.value.as_dict()


@pytest.mark.parametrize(
    ("a", "b", "field", "message"),
    [
        ("sales", "sales/", "sinks[1]", "writes where sinks[0] writes"),
        ("sales", "sales/orders", "sinks[1]", "is inside sinks[0]'s or holds it"),
        ("sales/orders", "sales", "sinks[1]", "is inside sinks[0]'s or holds it"),
    ],
)
def test_two_sinks_of_one_connection_may_not_share_a_directory(a, b, field, message):
    assert message in errors_of(two_files_sinks(a, b))[field][0]


def test_two_sinks_beside_each_other_are_fine():
    spec = parse_spec(two_files_sinks("sales", "sales-eu"), connections=CONNECTIONS)
    assert [s.path for s in spec.sinks] == ["sales", "sales-eu"]


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("a//b", "has an empty directory ('//')"),
        ("x/../y", "directory '..' is not allowed"),
        ("./y", "directory '.' is not allowed"),
        ("%61", "directory '%61' is not allowed"),
        ("/abs", "must be relative"),
    ],
)
def test_a_sink_path_is_stored_canonical_or_refused(path, message):
    """What is stored is what every comparison and the job's marker digest use: a spelling
    with another canonical form is refused rather than silently rewritten."""
    assert message in errors_of(files_spec(path))["sink.path"][0]


def test_a_trailing_slash_is_dropped_and_the_stored_path_is_its_own_canonical_form():
    spec = parse_spec(files_spec("sales/orders/"), connections=CONNECTIONS)
    assert spec.sink.path == "sales/orders"
    assert "/".join(relative(spec.sink.path)) == spec.sink.path
