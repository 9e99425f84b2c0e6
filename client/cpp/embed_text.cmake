# Writes the text file IN as a C++ string constant into OUT.
file(READ ${IN} RVD_TEXT)
file(WRITE ${OUT} "// Generated from ${IN}; do not edit.\n#include <string_view>\nnamespace rvd {\nextern const std::string_view kArchitecturesYaml = R\"rvdyaml(${RVD_TEXT})rvdyaml\";\n}  // namespace rvd\n")
