from rest_framework.pagination import PageNumberPagination


class Pagination(PageNumberPagination):
    """`?page=N`, with `?page_size=` up to 500 for scripts that want fewer round trips."""

    page_size_query_param = "page_size"
    max_page_size = 500
