"""The aws extra stays optional: the core never imports it, and its names are documented."""

from __future__ import annotations

import subprocess
import sys

import statebound.aws


def test_import_statebound_loads_neither_boto3_nor_the_aws_package():
    code = ("import sys, statebound; "
            "loaded = [m for m in ('boto3', 'botocore', 'statebound.aws') if m in sys.modules]; "
            "print(loaded)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_every_public_class_is_documented_and_has_its_one_verb():
    classes = {name: getattr(statebound.aws, name) for name in statebound.aws.__all__
               if isinstance(getattr(statebound.aws, name), type)}
    assert sorted(classes) == ["EventBridgeProcessor", "LambdaInvoker", "LambdaProcessor", "SQSProcessor"]
    for name, cls in classes.items():
        verb = "start" if name == "LambdaInvoker" else "deliver"
        assert cls.__doc__ and getattr(cls, verb).__doc__, name
