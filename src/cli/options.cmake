# The run options (CLI11 + TOML) and the progress reporter (with its TensorBoard writer), as a
# library the tests link without the tandem program. Included by src/cli/CMakeLists.txt.
add_library(tandem_cli_options STATIC
  ${CMAKE_CURRENT_LIST_DIR}/config_file.cc
  ${CMAKE_CURRENT_LIST_DIR}/data_options.cc
  ${CMAKE_CURRENT_LIST_DIR}/helper_process.cc
  ${CMAKE_CURRENT_LIST_DIR}/options.cc
  ${CMAKE_CURRENT_LIST_DIR}/option_table.cc
  ${CMAKE_CURRENT_LIST_DIR}/megatron_options.cc
  ${CMAKE_CURRENT_LIST_DIR}/plan_options.cc
  ${CMAKE_CURRENT_LIST_DIR}/progress.cc
  ${CMAKE_CURRENT_LIST_DIR}/path_checks.cc
  ${CMAKE_CURRENT_LIST_DIR}/sizes.cc
)
target_link_libraries(tandem_cli_options
  PUBLIC tandem_core tandem_data tandem_ops tandem_planner tandem_io CLI11::CLI11 PkgConfig::TOMLPP nlohmann_json::nlohmann_json
  PRIVATE tandem_warnings
)
