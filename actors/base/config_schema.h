/*
** Inside the settings: the schema's tables as the loader (config.c) reads them. Only
** actors/base/config*.c include this.
*/
#ifndef RT_CONFIG_SCHEMA_H
#define RT_CONFIG_SCHEMA_H

#include "config.h"

/* The top-level settings, NULL-terminated; a setting's index is its origin's (rt_conf_t). */
extern const rt_setting_t rt__conf_settings[];
/* The cluster table's keys ("cluster.replicas"), NULL-terminated. */
extern const rt_setting_t rt__conf_cluster_settings[];
size_t rt__conf_nsettings(void);
/* A string setting's choices as "a, b or c" (errors and the reference say them so). */
void rt__conf_choices_text(const char *const *choices, char *out, size_t n);

#endif
