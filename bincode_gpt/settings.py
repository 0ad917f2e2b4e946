"""
The command line of every script, generated from a dataclass of settings: one --name option per field,
its help and default from setting(); presets that change several defaults at once (preset_setting).
"""

import argparse
import typing
from dataclasses import MISSING, field, fields


def parse_int(s):
    """'5000' or '5e3' -> 5000; '2.5' is an error."""
    try:
        x = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {s!r}") from None
    if not x.is_integer():
        raise argparse.ArgumentTypeError(f"expected an integer, got {s!r}")
    return int(x)


def parse_bool(s):
    if s.lower() in ("1", "true", "yes", "on"):
        return True
    if s.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {s!r}")


def setting(default=MISSING, help="", **argument):
    """A dataclass field with its --help text, for config_parser. Other keywords go to argparse's
    add_argument: choices=[...], nargs=..., type=... (instead of the annotation's); positional=True
    makes it a positional argument. A list default is copied for each instance."""
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata={"help": help, **argument})
    return field(default=default, metadata={"help": help, **argument})


def preset_setting(default, help="", **presets):
    """A setting whose value a preset switch can change: `steps: int = preset_setting(600, "...", quick=60)`
    is 600, or 60 under --quick, unless the command line names --steps. The field is None after parsing
    when not given ("the preset's value"); resolve_presets fills it in. --help shows the default and
    each preset's value."""
    values = "".join(f"; --{name}: {_shown(value)}" for name, value in presets.items())
    return setting(None, f"{help} (default {_shown(default)}{values})".lstrip(), presets={None: default, **presets})


def _shown(value):
    return repr(value) if value == "" else value  # an empty value is seen as ''



def resolve_presets(cfg, *switches):
    """Fill each preset_setting of `cfg` left unset with the value of the preset whose bool switch (a
    field named in `switches`, e.g. "quick") is on, else its default. Two switches on at once is a
    ValueError: they are two different studies."""
    on = [name for name in switches if getattr(cfg, name)]
    if len(on) > 1:
        raise ValueError(f"{' and '.join('--' + name for name in on)} are two different studies: choose one")
    for f in fields(cfg):
        if "presets" in f.metadata and getattr(cfg, f.name) is None:
            values = f.metadata["presets"]
            setattr(cfg, f.name, values.get(on[0] if on else None, values[None]))
    return cfg


def config_parser(cls, description, epilog=None):
    """An argparse parser for dataclass `cls`: one --name option per field, help from setting().

    - Types come from the annotations: an int also takes 5e3; an optional field (`int | None`) takes
      "none" to mean unset.
    - Bools take --flag, --no-flag or --flag=true/false. In a parser with positional arguments a bool
      is only --flag / --no-flag, so it never takes the positional after it as its value.
    - setting(help=..., positional=True): a positional argument (`python -m tools.convert hf2native SRC OUT`);
      with no default it is required. Other add_argument keywords (choices=[...], nargs=...) pass
      through.
    - `cls` may be a dict {command: dataclass} for a script with subcommands: one subparser each, its
      help the dataclass's docstring; parse_settings returns the chosen command's dataclass.
    - preset_setting(default, help, quick=...): a value that a preset switch (a bool field such as
      --quick) changes; resolve_presets(cfg, "quick") fills it in after parse_settings.
    --help shows each default unless the help text already speaks of it. parse_settings(parser, argv)
    gives the filled dataclass.
    """
    p = argparse.ArgumentParser(description=description, epilog=epilog, formatter_class=_HelpFormatter)
    p.settings = cls
    if isinstance(cls, dict):
        sub = p.add_subparsers(dest="command", required=True)
        for name, command in cls.items():
            doc = command.__doc__.strip()
            _add_fields(sub.add_parser(name, help=doc, description=doc, formatter_class=_HelpFormatter), command)
    else:
        _add_fields(p, cls)
    return p


def parse_settings(parser, argv=None):
    """argv -> the dataclass that config_parser made `parser` from, filled in (with subcommands: the
    chosen command's dataclass)."""
    args = vars(parser.parse_args(argv))
    cls = parser.settings
    return cls[args.pop("command")](**args) if isinstance(cls, dict) else cls(**args)


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Each option's default in --help, unless its help already speaks of it; description and epilog
    as written."""

    def _get_help_string(self, action):
        return action.help if "default" in (action.help or "") else super()._get_help_string(action)


def _add_fields(p, cls):
    hints = typing.get_type_hints(cls)
    switches = any(f.metadata.get("positional") for f in fields(cls))  # bools as --flag / --no-flag only
    for f in fields(cls):
        args = typing.get_args(hints[f.name])
        kind = next((t for t in args if t is not type(None)), hints[f.name])
        parse = _parser_of(kind)
        if type(None) in args:
            parse = _or_none(parse)
        default = f.default_factory() if f.default_factory is not MISSING else f.default
        extra = {k: v for k, v in f.metadata.items() if k not in ("help", "positional", "presets")}
        parse = extra.pop("type", parse)
        help = f.metadata.get("help", "")
        if f.metadata.get("positional"):
            given = {} if default is MISSING else {"default": default}
            p.add_argument(f.name, type=parse, help=help, **given, **extra)
        elif kind is bool:
            how = (dict(action="store_const", const=True) if switches
                   else dict(nargs="?", const=True, type=parse, metavar="BOOL"))
            off = f"; --no-{f.name} turns it off" if default is not False else ""
            p.add_argument(f"--{f.name}", default=default, help=help + off, **how)
            p.add_argument(f"--no-{f.name}", dest=f.name, action="store_false", help=argparse.SUPPRESS)
        else:
            p.add_argument(f"--{f.name}", type=parse, default=default, help=help, **extra)


def _parser_of(kind):
    return {int: parse_int, bool: parse_bool}.get(kind, kind)


def _or_none(parse):
    def parse_optional(s):
        return None if s.lower() in ("none", "null") else parse(s)

    parse_optional.__name__ = getattr(parse, "__name__", "value")  # argparse names the type in its errors
    return parse_optional


def parse_command_line(cls, doc, argv=None, presets=()):
    """argv -> a filled `cls` (its parser described by the first paragraph of the script's `doc`), with the
    values of the preset switches named in `presets` filled in (resolve_presets)."""
    parser = config_parser(cls, doc.strip().split("\n\n")[0])
    return resolve_presets(parse_settings(parser, argv), *presets)


def check_at_least_1(cfg, *names):
    """A ValueError naming the first of these counts below 1 (None: unset, passes)."""
    for name in names:
        value = getattr(cfg, name)
        if value is not None and value < 1:
            raise ValueError(f"--{name} must be at least 1, got {value}")
