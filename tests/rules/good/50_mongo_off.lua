-- Disabled, and its sink is not configured: loads, but cannot be enabled.
return {
    name = "mongo_off",
    from = "m/#",
    select = function(msg) return { p = msg.payload } end,
    to = { mongo = { collection = "x" } },
    enabled = false,
}
