"""The browser's pages: a face over definitions, supervision and observability."""
