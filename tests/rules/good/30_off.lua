-- Disabled in the file: loaded, counted nowhere until enabled.
return {
    name = "off",
    from = "#",
    enabled = false,
    select = function(msg) return { topic = msg.topic } end,
    to = { "store" },
}
