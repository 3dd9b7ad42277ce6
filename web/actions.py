"""Placeholder: routes of this blueprint are being written (see docs/DESIGN.md, Web)."""

from flask import Blueprint

bp = Blueprint("actions", __name__)
