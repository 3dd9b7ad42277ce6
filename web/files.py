"""Placeholder: routes of this blueprint are being written (see docs/DESIGN.md, Web)."""

from flask import Blueprint

bp = Blueprint("files", __name__)
