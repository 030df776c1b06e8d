"""The API's JSON parser: every JSON body goes through controlplane.bounded_json, so no view,
serializer or validator ever sees a document nested too deep, a number the control plane
cannot hold, a string PostgreSQL cannot store or a key given twice (each answered 400 with
field errors naming where). The REST framework's default parser (REST_FRAMEWORK's
DEFAULT_PARSER_CLASSES); a body over DATA_UPLOAD_MAX_MEMORY_SIZE is refused before it is
parsed (413, controlplane.api.errors)."""

from __future__ import annotations

from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser, get_encoding

from controlplane import bounded_json


class BodyRefused(ParseError):
    """A body that is JSON but not one the control plane accepts: its detail is field
    errors (`{"spec.source.topics[0]": ["contains U+0000 ..."]}`), the API's 400 shape."""


class BoundedJSONParser(JSONParser):
    def parse(self, stream, media_type=None, parser_context=None):
        encoding = get_encoding(parser_context or {})
        try:
            text = stream.read().decode(encoding)
        except UnicodeDecodeError as exc:
            raise ParseError(
                f"JSON parse error - the body is not valid {encoding}: {exc}"
            ) from None
        try:
            return bounded_json.loads(text)
        except bounded_json.Refused as exc:
            raise BodyRefused(exc.errors) from None
        except ValueError as exc:  # not JSON: the message says where
            raise ParseError(f"JSON parse error - {exc}") from None
