"""Render CloudFormation values (Ref, Fn::GetAtt, Fn::Join, Fn::Sub...) to plain strings.

The emulated cloud and the tests create the synthesized stack's resources in
moto themselves; this turns the template's references (a state machine
definition's `Fn::Join` of function ARNs, a function's environment) into
the names and ARNs of those moto resources, so the definition CDK wrote is
the one that runs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Resolver:
    """Values of the resources created so far: logical id -> Ref value and attributes."""

    region: str = "us-east-1"
    account: str = "123456789012"
    partition: str = "aws"
    refs: dict[str, str] = field(default_factory=dict)
    attributes: dict[tuple[str, str], str] = field(default_factory=dict)

    def pseudo(self) -> dict[str, str]:
        return {
            "AWS::Region": self.region,
            "AWS::AccountId": self.account,
            "AWS::Partition": self.partition,
            "AWS::URLSuffix": "amazonaws.com",
            "AWS::StackName": "Braid",
        }

    def ref(self, name: str) -> str:
        pseudo = self.pseudo()
        if name in pseudo:
            return pseudo[name]
        if name not in self.refs:
            raise KeyError(f"template refers to {name}, which was not created in the emulator")
        return self.refs[name]

    def get_att(self, name: str, attribute: str) -> str:
        if (name, attribute) not in self.attributes:
            raise KeyError(f"template needs {name}.{attribute}, which the emulator does not provide")
        return self.attributes[(name, attribute)]

    def render(self, value: Any) -> Any:
        if isinstance(value, list):
            return [self.render(v) for v in value]
        if not isinstance(value, dict):
            return value
        if len(value) == 1:
            (name, arg), = value.items()
            if name == "Ref":
                return self.ref(arg)
            if name == "Fn::GetAtt":
                logical, attribute = arg if isinstance(arg, list) else arg.split(".", 1)
                return self.get_att(logical, attribute)
            if name == "Fn::Join":
                separator, parts = arg
                return separator.join(str(self.render(p)) for p in parts)
            if name == "Fn::Sub":
                template, variables = (arg, {}) if isinstance(arg, str) else (arg[0], arg[1])
                rendered = {k: str(self.render(v)) for k, v in variables.items()}

                def substitute(match: re.Match[str]) -> str:
                    key = match.group(1)
                    if key in rendered:
                        return rendered[key]
                    if "." in key:
                        logical, attribute = key.split(".", 1)
                        return self.get_att(logical, attribute)
                    return self.ref(key)

                return re.sub(r"\$\{([^}!]+)\}", substitute, template)
            if name == "Fn::Select":
                index, items = arg
                return self.render(items)[int(index)]
            if name == "Fn::Split":
                separator, text = arg
                return str(self.render(text)).split(separator)
        return {k: self.render(v) for k, v in value.items()}
