/* params_schema.h - the subset of JSON Schema the plugin host enforces on a
 * command's parameters (rlai_command_desc.params_schema) before it calls
 * the handler.
 *
 * Keywords enforced: type (a name or an array of names: object, array,
 * string, number, integer, boolean, null), properties, required,
 * additionalProperties (a boolean or a schema; absent = extra keys are
 * accepted, as JSON Schema says), minimum, maximum, exclusiveMinimum,
 * exclusiveMaximum (numbers), minLength, maxLength (in Unicode code
 * points), enum, const, items (one schema for every element), minItems,
 * maxItems, oneOf, anyOf, allOf. Annotations (description, title,
 * default, examples, format, $comment, $schema, $id, deprecated, readOnly,
 * writeOnly) are accepted and not checked. Any other keyword makes the
 * schema refused at registration ("not supported"), so a schema never
 * promises a check the host does not make. A subschema may be an object
 * or a boolean (true accepts anything, false nothing).
 *
 * Pure functions: no state, no allocation except on the stack, any thread.
 */
#ifndef RLAI_HOST_PARAMS_SCHEMA_H
#define RLAI_HOST_PARAMS_SCHEMA_H

#include <stddef.h>

#include <cjson/cJSON.h>

/* Deepest nesting of subschemas accepted. */
#define RLAI_PARAMS_SCHEMA_MAX_DEPTH 16

/* Checks that `schema` (borrowed) is a schema this host can enforce for a
 * params object: a JSON object whose "type", if present, is "object";
 * known keywords only, each of the right type; minimum <= maximum and
 * minLength <= maxLength; every "required" name declared when
 * additionalProperties is false. Returns 0, or RLAI_ERR_INVALID_ARG with a
 * message naming the keyword and where it is ("temperature:
 * \"maximum\" must be a number") in err. */
int rlai_params_schema_check(const cJSON *schema, char *err, size_t errlen);

/* Validates `params` (borrowed) against a schema that passed
 * rlai_params_schema_check. Returns 0, or RLAI_ERR_INVALID_ARG with a
 * message naming the parameter and the rule in err, e.g.
 * "'temperature' must be <= 2", "'character' is required",
 * "'colour' is not accepted (additionalProperties is false; parameters:
 * character, message)". Nested names are dotted ('model.n_layer'), array
 * elements indexed ('stop[2]'). */
int rlai_params_schema_validate(const cJSON *schema, const cJSON *params, char *err, size_t errlen);

#endif
