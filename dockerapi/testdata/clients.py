"""Everyday docker-py work, one operation a line: PASS NAME or FAIL NAME: why.

Run with DOCKER_HOST (and DOCKER_CONFIG) set; argv[1] is an image the
engine has, argv[2] a prefix for the names of what the script makes (it
removes them all before it ends).
"""
import sys
import time

import docker

image, prefix = sys.argv[1], sys.argv[2]
client = docker.from_env(timeout=120)
state = {}
results = []


def op(name):
    def wrap(fn):
        try:
            fn()
            results.append((name, None))
        except Exception as e:  # every failure is a result
            results.append((name, str(e).replace("\n", " ")[:300]))
        return fn
    return wrap


@op("ping")
def _():
    assert client.ping()


@op("version")
def _():
    assert client.version()["ApiVersion"]


@op("info")
def _():
    assert "Containers" in client.info()


@op("images.list")
def _():
    tags = [t for im in client.images.list() for t in im.tags]
    assert image in tags, "%s not among %d tags" % (image, len(tags))


@op("images.get")
def _():
    im = client.images.get(image)
    assert image in im.tags and im.id.startswith("sha256:")
    state["image_id"] = im.id


@op("images.get by id")
def _():
    assert image in client.images.get(state["image_id"]).tags


@op("image.history")
def _():
    assert len(client.images.get(image).history()) >= 1


@op("containers.run -d")
def _():
    state["c"] = client.containers.run(image, detach=True, name=prefix + "-web")


@op("container running")
def _():
    c = state["c"]
    for _ in range(600):
        c.reload()
        if c.status == "running":
            return
        time.sleep(0.1)
    raise AssertionError("status " + c.status)


@op("containers.list")
def _():
    assert prefix + "-web" in [c.name for c in client.containers.list()]


@op("container.logs")
def _():
    state["c"].logs()


@op("container.pause")
def _():
    state["c"].pause()
    state["c"].reload()
    assert state["c"].status == "paused", state["c"].status


@op("container.unpause")
def _():
    state["c"].unpause()
    state["c"].reload()
    assert state["c"].status == "running", state["c"].status


@op("container.top")
def _():
    assert state["c"].top()["Processes"]


@op("container.exec_run")
def _():
    assert state["c"].exec_run(["true"]).exit_code == 0


@op("container.rename")
def _():
    state["c"].rename(prefix + "-web2")


@op("container.stop")
def _():
    state["c"].stop(timeout=5)


@op("container.remove")
def _():
    state["c"].remove(force=True)


@op("networks.create")
def _():
    state["n"] = client.networks.create(prefix + "-net", labels={"k": "v"})


@op("networks.list")
def _():
    assert prefix + "-net" in [n.name for n in client.networks.list()]


@op("networks.get")
def _():
    assert client.networks.get(prefix + "-net").attrs["Labels"]["k"] == "v"


@op("containers.create on a network")
def _():
    state["c2"] = client.containers.create(image, name=prefix + "-on", network=prefix + "-net")


@op("container.remove (created)")
def _():
    state["c2"].remove(force=True)


@op("network.connect (running)")
def _():
    c = client.containers.run(image, detach=True, name=prefix + "-joins")
    state["c3"] = c
    for _ in range(600):
        c.reload()
        if c.status == "running":
            break
        time.sleep(0.1)
    client.networks.get(prefix + "-net").connect(c, aliases=["joined"])
    c.reload()
    nets = c.attrs["NetworkSettings"]["Networks"]
    assert prefix + "-net" in nets, list(nets)
    assert "joined" in (nets[prefix + "-net"]["Aliases"] or []), nets[prefix + "-net"]


@op("network.disconnect (running)")
def _():
    c = state["c3"]
    client.networks.get(prefix + "-net").disconnect(c)
    c.reload()
    nets = c.attrs["NetworkSettings"]["Networks"] or {}
    assert prefix + "-net" not in nets, list(nets)
    c.remove(force=True)


@op("network.remove")
def _():
    client.networks.get(prefix + "-net").remove()


@op("volumes.create")
def _():
    state["v"] = client.volumes.create(prefix + "-vol")


@op("volumes.list")
def _():
    assert prefix + "-vol" in [v.name for v in client.volumes.list()]


@op("volume.remove")
def _():
    state["v"].remove()


@op("df")
def _():
    assert "Images" in client.df()


# Leave nothing behind, whatever passed.
for name in (prefix + "-web", prefix + "-web2", prefix + "-on", prefix + "-joins"):
    try:
        client.containers.get(name).remove(force=True)
    except Exception:
        pass
for kind in (client.networks, client.volumes):
    try:
        kind.get(prefix + ("-net" if kind is client.networks else "-vol")).remove()
    except Exception:
        pass

for name, err in results:
    print("PASS " + name if err is None else "FAIL %s: %s" % (name, err))
passed = sum(1 for _, err in results if err is None)
print("passed %d of %d" % (passed, len(results)))
