"""A stand-in for the host's ``nvidia-ctk`` in unit tests (no GPU, no toolkit here): ``cdi generate``
writes what the real one writes for the UUIDs in $FAKE_CTK_DEVICES (kind from --vendor/--class, a
device per UUID and one named ``all`` with every card's node, the driver's library and the ldcache
hook in the common edits);
``cdi transform root`` takes --from off every path. Each call's arguments go to $FAKE_CTK_CALLS.
$FAKE_CTK_EXIT makes every call fail as the real one does without a driver."""

import json
import os
import sys

LIB = "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15"

args = sys.argv[1:]
with open(os.environ["FAKE_CTK_CALLS"], "a") as calls:
    calls.write(json.dumps(args) + "\n")
if os.environ.get("FAKE_CTK_EXIT"):
    print("nvidia-ctk: failed to initialize NVML: Driver Not Loaded", file=sys.stderr)
    sys.exit(int(os.environ["FAKE_CTK_EXIT"]))
opt = dict(a[2:].split("=", 1) for a in args if a.startswith("--") and "=" in a)
if args[:2] == ["cdi", "generate"]:
    devices = [
        {
            "name": uuid,
            "containerEdits": {
                "deviceNodes": [{"path": f"/dev/nvidia{i}", "hostPath": f"{opt['dev-root']}/dev/nvidia{i}"}]
            },
        }
        for i, uuid in enumerate(os.environ["FAKE_CTK_DEVICES"].split(","))
    ]
    hook = {"hookName": "createContainer", "path": opt["nvidia-cdi-hook-path"], "args": ["nvidia-cdi-hook"]}
    spec = {
        "cdiVersion": "0.5.0",
        "kind": f"{opt['vendor']}/{opt['class']}",
        # "all": every card's device node (the real one refuses a device without edits).
        "devices": [
            *devices,
            {
                "name": "all",
                "containerEdits": {
                    "deviceNodes": [n for d in devices for n in d["containerEdits"]["deviceNodes"]]
                },
            },
        ],
        "containerEdits": {
            "mounts": [{"hostPath": opt["driver-root"] + LIB, "containerPath": LIB}],
            "hooks": [hook],
        },
    }
    with open(opt["output"], "w") as out:
        json.dump(spec, out)
else:
    with open(opt["input"]) as src, open(opt["output"], "w") as out:
        out.write(src.read().replace(opt["from"], ""))
