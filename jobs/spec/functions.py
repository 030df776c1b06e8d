"""Which Spark SQL functions a pipeline's transform may call.

A transform is SQL written by an *editor* and run by the Spark job as ``spark.sql(...)``, so
the functions it may call are an explicit allow-list: every name Spark 4.3's ``SHOW
FUNCTIONS`` lists (591 of them, operators, aggregates and table-valued functions included)
is either in ALLOWED or in REFUSED, with the reason it is refused.
``tests/test_spec_functions_match_spark.py`` compares the two with a real Spark session, so
an upgrade that adds a function fails the tests until someone has reviewed it here.

What a transform must never reach: a shell, the JVM's reflection, local files or URLs, the
catalog or the session beyond the ``source`` view, or facts about the machine it runs on.
Everything else Spark ships (string, math, date, JSON, array, map, aggregate, window,
sketch... functions) only computes on its arguments and is allowed; resource exhaustion
(``repeat('x', 1e9)``) is not something this list tries to prevent.

``jobs/spec/sql.py`` applies the list to each function *as the user wrote it* (names
compare case-insensitively, back-quoted names included). Names are lower case. Plain data:
no imports of Django, Celery or PySpark.
"""

from __future__ import annotations

__all__ = ["ALLOWED", "ALLOWED_BY_GROUP", "GRAMMAR_FUNCTIONS", "REFUSED"]

# Allowed functions, grouped as Spark's DESCRIBE FUNCTION groups them (its ExpressionInfo
# group; "ungrouped" holds the few operators and CASE that Spark lists without one), sorted
# within each group. Operators are listed because SHOW FUNCTIONS lists them: Spark also
# accepts them as calls, e.g. `+`(1, 2).
ALLOWED_BY_GROUP: dict[str, str] = {
    "ungrouped": """
        != <> case ||
    """,
    "agg_funcs": """
        any any_value approx_count_distinct approx_percentile approx_top_k
        approx_top_k_accumulate approx_top_k_combine array_agg avg bit_and bit_or bit_xor
        bitmap_and_agg bitmap_construct_agg bitmap_or_agg bool_and bool_or collect_list
        collect_set collect_union corr count count_if count_min_sketch covar_pop covar_samp
        every first first_value grouping grouping_id histogram_numeric hll_sketch_agg
        hll_union_agg kll_merge_agg_bigint kll_merge_agg_double kll_merge_agg_float
        kll_sketch_agg_bigint kll_sketch_agg_double kll_sketch_agg_float kurtosis last
        last_value listagg max max_by mean measure median min min_by mode percentile
        percentile_approx percentile_cont percentile_disc regr_avgx regr_avgy regr_count
        regr_intercept regr_r2 regr_slope regr_sxx regr_sxy regr_syy skewness some std stddev
        stddev_pop stddev_samp string_agg sum theta_intersection_agg theta_sketch_agg
        theta_union_agg try_avg try_sum tuple_intersection_agg_double
        tuple_intersection_agg_integer tuple_sketch_agg_double tuple_sketch_agg_integer
        tuple_union_agg_double tuple_union_agg_integer var_pop var_samp variance
    """,
    "array_funcs": """
        array array_append array_compact array_contains array_distinct array_except array_insert
        array_intersect array_join array_max array_min array_position array_prepend array_remove
        array_repeat array_size array_union arrays_overlap arrays_zip flatten get sequence
        shuffle slice sort_array
    """,
    "bitwise_funcs": """
        & << >> >>> ^ bit_count bit_get getbit shiftleft shiftright shiftrightunsigned | ~
    """,
    "collection_funcs": """
        cardinality concat element_at reverse size try_element_at
    """,
    "conditional_funcs": """
        between coalesce if ifnull nanvl nullif nullifzero nvl nvl2 when zeroifnull
    """,
    "conversion_funcs": """
        bigint binary boolean cast date decimal double float int smallint string time timestamp
        tinyint
    """,
    "csv_funcs": """
        from_csv schema_of_csv to_csv
    """,
    "datetime_funcs": """
        add_months convert_timezone curdate current_date current_time current_timestamp
        current_timezone date_add date_diff date_format date_from_unix_date date_part date_sub
        date_trunc dateadd datediff datepart day dayname dayofmonth dayofweek dayofyear extract
        from_unixtime from_utc_timestamp hour last_day localtime localtimestamp make_date
        make_dt_interval make_interval make_time make_timestamp make_timestamp_ltz
        make_timestamp_ntz make_ym_interval minute month monthname months_between next_day now
        quarter second session_window time_bucket time_diff time_from_micros time_from_millis
        time_from_seconds time_to_micros time_to_millis time_to_seconds time_trunc
        timestamp_micros timestamp_millis timestamp_nanos timestamp_seconds to_date to_time
        to_timestamp to_timestamp_ltz to_timestamp_ntz to_unix_timestamp to_utc_timestamp trunc
        try_make_interval try_make_timestamp try_make_timestamp_ltz try_make_timestamp_ntz
        try_to_date try_to_time try_to_timestamp unix_date unix_micros unix_millis unix_nanos
        unix_seconds unix_timestamp weekday weekofyear window window_time year
    """,
    "generator_funcs": """
        explode explode_outer inline inline_outer posexplode posexplode_outer stack
    """,
    "hash_funcs": """
        crc32 hash md5 sha sha1 sha2 xxhash64
    """,
    "json_funcs": """
        from_json get_json_object json_array_length json_object_keys json_tuple schema_of_json
        to_json
    """,
    "lambda_funcs": """
        aggregate array_sort exists filter forall map_filter map_zip_with reduce transform
        transform_keys transform_values zip_with
    """,
    "map_funcs": """
        map map_concat map_contains_key map_entries map_from_arrays map_from_entries map_keys
        map_values str_to_map
    """,
    "math_funcs": """
        % * + - / abs acos acosh asin asinh atan atan2 atanh bin bround cbrt ceil ceiling conv
        cos cosh cot csc degrees div e exp expm1 factorial floor greatest hex hypot least ln log
        log10 log1p log2 mod negative pi pmod positive pow power radians rand randn random rint
        round sec sign signum sin sinh sqrt tan tanh try_add try_divide try_mod try_multiply
        try_subtract unhex uniform width_bucket
    """,
    "misc_funcs": """
        aes_decrypt aes_encrypt assert_true bitmap_bit_position bitmap_bucket_number
        bitmap_count hmac input_file_block_length input_file_block_start input_file_name
        monotonically_increasing_id raise_error spark_partition_id try_aes_decrypt typeof uuid
    """,
    "predicate_funcs": """
        ! < <= <=> = == > >= and equal_null ilike in isnan isnotnull isnull like not or regexp
        regexp_like rlike
    """,
    "sketch_funcs": """
        approx_top_k_estimate hll_sketch_estimate hll_union kll_sketch_get_n_bigint
        kll_sketch_get_n_double kll_sketch_get_n_float kll_sketch_get_quantile_bigint
        kll_sketch_get_quantile_double kll_sketch_get_quantile_float kll_sketch_get_rank_bigint
        kll_sketch_get_rank_double kll_sketch_get_rank_float kll_sketch_merge_bigint
        kll_sketch_merge_double kll_sketch_merge_float kll_sketch_to_string_bigint
        kll_sketch_to_string_double kll_sketch_to_string_float theta_difference
        theta_intersection theta_sketch_estimate theta_union tuple_difference_double
        tuple_difference_integer tuple_difference_theta_double tuple_difference_theta_integer
        tuple_intersection_double tuple_intersection_integer tuple_intersection_theta_double
        tuple_intersection_theta_integer tuple_sketch_estimate_double
        tuple_sketch_estimate_integer tuple_sketch_summary_double tuple_sketch_summary_integer
        tuple_sketch_theta_double tuple_sketch_theta_integer tuple_union_double
        tuple_union_integer tuple_union_theta_double tuple_union_theta_integer
    """,
    "st_funcs": """
        st_asbinary st_geogfromwkb st_geomfromwkb st_setsrid st_srid
    """,
    "string_funcs": """
        ascii base64 bit_length btrim char char_length character_length chr collate collation
        concat_ws contains decode elt encode endswith find_in_set format_number format_string
        from_base32 initcap instr is_valid_utf8 jaro_winkler_similarity lcase left len length
        levenshtein locate lower lpad ltrim luhn_check make_valid_utf8 mask octet_length overlay
        position printf quote randstr regexp_count regexp_extract regexp_extract_all
        regexp_instr regexp_replace regexp_substr repeat replace right rpad rtrim sentences
        soundex space split split_part startswith substr substring substring_index to_base32
        to_binary to_char to_number to_varchar translate trim try_to_binary try_to_number
        try_validate_utf8 ucase unbase64 upper validate_utf8
    """,
    "struct_funcs": """
        named_struct struct
    """,
    "table_funcs": """
        range
    """,
    "url_funcs": """
        parse_url try_parse_url try_url_decode url_decode url_encode
    """,
    "variant_funcs": """
        is_valid_variant is_variant_null parse_json schema_of_variant schema_of_variant_agg
        to_variant_object try_parse_json try_variant_array_append try_variant_get
        try_variant_insert try_variant_set variant_array_append variant_delete variant_explode
        variant_explode_outer variant_get variant_insert variant_set variant_strip_nulls
    """,
    "vector_funcs": """
        vector_avg vector_cosine_similarity vector_inner_product vector_l2_distance vector_norm
        vector_normalize vector_sum
    """,
    "window_funcs": """
        counter_diff cume_dist dense_rank lag lead nth_value ntile percent_rank rank row_number
    """,
    "xml_funcs": """
        to_xml
    """,
}

ALLOWED: frozenset[str] = frozenset(
    name for names in ALLOWED_BY_GROUP.values() for name in names.split()
)

_CALLS_JAVA = "it calls any Java method by reflection"
_XPATH = (
    "it parses XML with the JDK's XML parser, whose DTDs and external entities can read "
    "files and URLs; not needed by a transform"
)
_PROTOBUF = (
    "it reads a Protobuf descriptor file named by its argument from the driver's file system"
)
_AVRO = (
    "it loads the optional spark-avro module by reflection (not installed); sources are "
    "JSON, so a transform doesn't need it"
)
_OS_USER = "it reveals the operating-system user Spark runs as"
_CATALOG = "it reads the session's catalog state, which a transform doesn't need"
_TABLE_FUNCTION = (
    "it is a table-valued function that does not generate rows from its arguments; a "
    "transform reads only the source view"
)

# Refused functions, each with the reason the user is shown:
# "transform calls the function 'x', which is not allowed: <reason>".
REFUSED: dict[str, str] = {
    # Runs code.
    "java_method": _CALLS_JAVA,
    "reflect": _CALLS_JAVA,
    "try_reflect": _CALLS_JAVA,
    # Reads local files or URLs.
    "from_xml": "its options can name an XSD file to read (rowValidationXSDPath)",
    "schema_of_xml": "its options can name an XSD file to read (rowValidationXSDPath)",
    "xpath": _XPATH,
    "xpath_boolean": _XPATH,
    "xpath_double": _XPATH,
    "xpath_float": _XPATH,
    "xpath_int": _XPATH,
    "xpath_long": _XPATH,
    "xpath_number": _XPATH,
    "xpath_short": _XPATH,
    "xpath_string": _XPATH,
    "from_protobuf": _PROTOBUF,
    "to_protobuf": _PROTOBUF,
    "from_avro": _AVRO,
    "schema_of_avro": _AVRO,
    "to_avro": _AVRO,
    # Reveals the machine or the session.
    "current_user": _OS_USER,
    "session_user": _OS_USER,
    "user": _OS_USER,
    "current_catalog": _CATALOG,
    "current_database": _CATALOG,
    "current_path": _CATALOG,
    "current_schema": _CATALOG,
    "version": "it reveals the Spark version and build, which a transform doesn't need",
    "python_worker_logs": (
        "it reads the logs of the Spark driver's Python workers, which may hold other "
        "pipelines' data"
    ),
    # Table-valued functions that are not row generators (those are in ALLOWED).
    "collations": _TABLE_FUNCTION,
    "sql_keywords": _TABLE_FUNCTION,
}

# Allowed forms that Spark's grammar parses itself, so SHOW FUNCTIONS doesn't list them:
# timestampadd(HOUR, 1, ts), timestampdiff(DAY, a, b), timediff(...), try_cast(x AS INT).
GRAMMAR_FUNCTIONS: frozenset[str] = frozenset(
    {"timestampadd", "timestampdiff", "timediff", "try_cast"}
)
